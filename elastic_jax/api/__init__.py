"""Shared models: the ElasticTrainingJob resource and the control-API messages."""
