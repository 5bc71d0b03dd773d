"""OpenAI's Batch API on the fleet: /v1/files and /v1/batches (routes), kept in Redis (store), run by every
gateway replica's Runner under a lease (runner), lines in and out in OpenAI's batch format (lines)."""
