"""Fleet replays: many recordings replayed, their frames as one Parquet dataset, and compared."""

__all__: list[str] = []
