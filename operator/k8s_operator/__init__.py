"""The kopf operator reconciling ElasticTrainingJob into a controller pod and worker JobSets."""
