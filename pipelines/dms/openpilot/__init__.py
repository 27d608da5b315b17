"""openpilot interoperation: cereal's wire format (:mod:`.events`), its logs and route segments."""
