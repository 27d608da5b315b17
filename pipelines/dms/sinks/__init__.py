"""Where the messages go: the sink protocol, its counting and its errors (:mod:`.base`), several
sinks driven as one (:mod:`.publish`), and one module a kind: in-process subscriptions
(:mod:`.memory`), files (:mod:`.file`: :mod:`.jsonl`, :mod:`.rlog`, :mod:`.parquet`), ZeroMQ
(:mod:`.zmq`, with :mod:`.zmq_gate`) and openpilot's cereal sockets (:mod:`.cereal`)."""
