"""The agent's inference core: model lifecycle, batching, statistics. No transport here."""
