"""SageMaker's routes, POST /invocations and GET /ping (routes)."""
