"""The API's documentation pages, served by the intake alone: Swagger UI at `/docs` and ReDoc
at `/redoc`, their scripts, styles and icon from the installed `fastapi-offline` package
under `/docs/assets/`. Neither page names another host, so both work with no internet."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from app.intake.openapi_doc import describe
from app.settings import Settings

DOCS_PATH = "/docs"
REDOC_PATH = "/redoc"
ASSETS_PATH = "/docs/assets"
# The package, and its folder, that holds Swagger UI's and ReDoc's built files.
ASSETS_PACKAGE = ("fastapi_offline", "static")
SWAGGER_JS = "swagger-ui-bundle.js"
SWAGGER_CSS = "swagger-ui.css"
REDOC_JS = "redoc.standalone.js"
FAVICON = "favicon.png"
SWAGGER_UI_PARAMETERS = {
    # Swagger UI's default validator is a service on another host: never ask it.
    "validatorUrl": None,
    # The bearer token typed into "Authorize" stays only as long as the tab.
    "persistAuthorization": False,
    "displayRequestDuration": True,
}


def install(app: FastAPI, settings: Settings) -> None:
    """Serve the two pages and their assets on `app` (built with `docs_url=None` and
    `redoc_url=None`), and add signing, the admin token and the error body to its OpenAPI
    document (`app.intake.openapi_doc`)."""
    app.mount(ASSETS_PATH, StaticFiles(packages=[ASSETS_PACKAGE]), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    title = app.title

    @app.get(DOCS_PATH, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS_PATH}/{SWAGGER_JS}",
            swagger_css_url=f"{root}{ASSETS_PATH}/{SWAGGER_CSS}",
            swagger_favicon_url=f"{root}{ASSETS_PATH}/{FAVICON}",
            swagger_ui_parameters=SWAGGER_UI_PARAMETERS,
        )

    @app.get(REDOC_PATH, include_in_schema=False)
    async def redoc(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_redoc_html(
            openapi_url=root + openapi_url,
            title=f"{title} - ReDoc",
            redoc_js_url=f"{root}{ASSETS_PATH}/{REDOC_JS}",
            redoc_favicon_url=f"{root}{ASSETS_PATH}/{FAVICON}",
            with_google_fonts=False,
        )

    describe(app, settings)


def _root(request: Request) -> str:
    """The path the intake is served under behind a proxy (`--root-path`), or ''."""
    return str(request.scope.get("root_path", "")).rstrip("/")
