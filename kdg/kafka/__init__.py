"""Wrappers over confluent-kafka: one module per client role."""
