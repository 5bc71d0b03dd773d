"""Async jobs: /v1/jobs (routes), the /v1/jobs/events stream (events), a settled job as one JSON object (results),
and webhooks that push it (webhooks), to the URLs the operator allows (webhookurls)."""
