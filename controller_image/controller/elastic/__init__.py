"""The elastic manager: active slice set, elastic_retry, retry policies, failure classification."""
