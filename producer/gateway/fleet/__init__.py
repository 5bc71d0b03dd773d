"""The fleet as operators see it: /health, /v1/models and /metrics (routes), and the live page /dashboard with
the /v1/fleet snapshot it polls (dashboard, its assets in dashboard/)."""
