"""What devices send, stored: the ingestor that validates and batches device messages
(:mod:`.decode` first, then the wire's pydantic types) into telemetry and status rows
(:mod:`.rows`), device presence (online, silent, offline), and telemetry retention."""
