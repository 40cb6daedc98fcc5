"""kdg: move data through Apache Kafka under a chosen delivery guarantee, and prove it held."""

__version__ = "0.1.0"
