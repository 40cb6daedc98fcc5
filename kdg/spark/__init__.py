"""`kdg spark-replay` on Spark: the connector jars, the session, the Kafka range and the executor-side writer."""
