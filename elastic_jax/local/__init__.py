"""Running an ElasticTrainingJob on one machine with local processes (the operator stand-in)."""
