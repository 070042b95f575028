"""The API's documentation page, served by the intake alone: Swagger UI at `/docs`, its
script, style and icon from the installed `fastapi-offline` package under `/docs/assets/`.
The page names no other host, so it works with no internet.

No ReDoc: its bundle loads its logo from its own CDN whatever it is told."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated

from fastapi import FastAPI, Request
from fastapi import Path as PathParameter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from app.config.settings import Settings
from app.errors import NotFound
from app.intake.openapi_doc import describe

DOCS_PATH = "/docs"
ASSETS_PATH = "/docs/assets"
# Where Swagger UI's built files are, in the package that ships them.
ASSETS_PACKAGE, ASSETS_FOLDER = "fastapi_offline", "static"
SWAGGER_JS = "swagger-ui-bundle.js"
SWAGGER_CSS = "swagger-ui.css"
FAVICON = "favicon.png"
# The files served, with their content types (not guessed from the host's MIME table).
ASSETS = {
    SWAGGER_JS: "text/javascript; charset=utf-8",
    SWAGGER_CSS: "text/css; charset=utf-8",
    FAVICON: "image/png",
}
SWAGGER_UI_PARAMETERS = {
    # Swagger UI's default validator is a service on another host: never ask it.
    "validatorUrl": None,
    # The bearer token typed into "Authorize" stays only as long as the page.
    "persistAuthorization": False,
    "displayRequestDuration": True,
}


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the page and its assets on `app` (built with `docs_url=None` and
    `redoc_url=None`), and add signing, the admin token and the error body to its OpenAPI
    document (`app.intake.openapi_doc`)."""
    openapi_url = app.openapi_url or "/openapi.json"
    title = f"{app.title} - Swagger UI"

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=title,
            swagger_js_url=f"{root}{ASSETS_PATH}/{SWAGGER_JS}",
            swagger_css_url=f"{root}{ASSETS_PATH}/{SWAGGER_CSS}",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/{FAVICON}",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )

    @app.get(ASSETS_PATH + "/{name}", include_in_schema=False)
    async def docs_asset(name: Annotated[str, PathParameter(max_length=64)]) -> FileResponse:
        if name not in ASSETS:
            raise NotFound(f"no documentation asset {name!r}")
        return FileResponse(asset_path(name), media_type=ASSETS[name])

    describe(app, settings)


def asset_path(name: str) -> Path:
    """The file of asset `name` in the installed package."""
    return Path(str(resources.files(ASSETS_PACKAGE).joinpath(ASSETS_FOLDER, name)))


def _root(request: Request) -> str:
    """The path the intake is served under behind a proxy (`--root-path`), or ''."""
    return str(request.scope.get("root_path", "")).rstrip("/")
