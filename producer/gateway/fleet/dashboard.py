"""GET /dashboard: a live page of the fleet (static HTML + JS + CSS from this package, no CDN, no build
step), and GET /v1/fleet, the snapshot it polls (producer/client/fleetview.py, as `embedfleet status --json`).

The page and its assets hold no data and are served without the key, as /health is: a browser cannot send
a bearer key when it navigates. The data is behind the key like every other route: with an API key set,
the page asks for it once (kept in the tab's sessionStorage) and sends it as `Authorization: Bearer` with
each poll. /dashboard/config.json tells the page whether to ask.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from embedfleet.producer.gateway.core.auth import require_key
from embedfleet.producer.gateway.core.service import Gateway, gateway

ASSETS = Path(__file__).with_name("dashboard")
# The page runs only its own script and talks only to this gateway.
HEADERS = {"Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
           "Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}

public = APIRouter()
protected = APIRouter(dependencies=[Depends(require_key)])


@public.get("/dashboard", include_in_schema=False)
async def page() -> FileResponse:
    return FileResponse(ASSETS / "index.html", media_type="text/html", headers=HEADERS)


@public.get("/dashboard/config.json", include_in_schema=False)
async def config(gw: Gateway = Depends(gateway)) -> dict:
    return {"api_key_required": bool(gw.settings.keys)}  # --api-key or --api-keys: require_key's own test


@protected.get("/v1/fleet")
async def fleet(gw: Gateway = Depends(gateway)) -> dict:
    """Models, their queues per priority, live workers and the last hour's failures (producer/client/fleetview.py)."""
    return await gw.producer.fleet()


def install(app: FastAPI) -> None:
    app.mount("/dashboard/assets", StaticFiles(directory=ASSETS), name="dashboard-assets")
    app.include_router(public)
    app.include_router(protected)
