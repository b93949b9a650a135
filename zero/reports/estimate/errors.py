"""The one error the estimator raises for bad input."""


class EstimateError(ValueError):
    """Bad input to the estimator (model source, config, sizes); the message says what to do."""
