"""The OpenAPI schema of the server, with the request bodies the routes parse themselves.

Routes read their JSON body by hand (see ``engine.server.protocol``), so FastAPI
cannot see it; ``request_body`` declares it on a route and ``install_openapi``
puts the pydantic models' schemas into ``components``, so ``/openapi.json``
describes every route exactly (and fuzzers generate meaningful requests).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

REF = "#/components/schemas/{model}"


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` of a route whose required JSON body is ``model``."""
    schema = {"$ref": REF.format(model=model.__name__)}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def install_openapi(app: FastAPI, models: tuple[type[BaseModel], ...]) -> None:
    """Make ``app.openapi()`` include the schemas of ``models`` (and the models they use)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                body = model.model_json_schema(ref_template=REF)
                components.update(body.pop("$defs", {}))
                components[model.__name__] = body
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
