"""What every API family of the gateway uses: the submit/wait service and its FastAPI dependency (service), the
request body and its chat input (schemas, chat), results as HTTP answers (encoding), the error table (errors),
API keys, their rates and job owners (auth, apikeys, owners), the body limit (limits), memory release (memory)
and the metrics (metrics)."""
