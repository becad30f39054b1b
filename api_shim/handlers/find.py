"""Searching scans: `POST /scans/find` (`api_shim.find` does the work) and the backlog."""

from __future__ import annotations

from aiohttp import web

from api_shim import rest_models, view
from api_shim.bodies import body_of
from api_shim.errors import bad_request
from api_shim.plumbing import SHIM, names_of, ok, parse_body

SMALL_ANSWER = 16 << 10  # written at once; a larger answer part by part as the client drains it


async def find_scans(request: web.Request) -> web.StreamResponse:
    scans, raw = request.app[SHIM].scans, await body_of(request)
    asked = scans.asked_before(raw)
    if asked is None:
        body = await parse_body(request, rest_models.FindBody)
        fields = view.find_projection(body.manifest_projection)
        if refused := sorted(fields & view.FIND_DISALLOWED):
            raise bad_request(
                f"manifest_projection cannot include: {', '.join(refused)}",
                "These deprecated fields are too large to return from /scans/find.",
            )
        query = dict(body.filter)
        if "is_deleted" not in query and not body.include_deleted:
            query["is_deleted"] = False
        asked = scans.ask(raw, query, fields)
    parts = await scans.find(asked, names_of(request))
    return await send(request, parts)


async def send(request: web.Request, parts: list[bytes]) -> web.StreamResponse:
    """A small answer at once; a larger one part by part as the client drains it (never one large write)."""
    size = sum(map(len, parts))
    if size <= SMALL_ANSWER:
        return web.Response(body=b"".join(parts), content_type="application/json", charset="utf-8")
    response = web.StreamResponse(headers={"Content-Type": "application/json; charset=utf-8"})
    response.content_length = size
    await response.prepare(request)
    try:
        for part in parts:
            await response.write(part)  # each awaits the client's draining past the high-water mark
        await response.write_eof()
    except ConnectionResetError:  # the client left: nobody to answer
        pass
    return response


async def backlog(request: web.Request) -> web.Response:
    return ok({"entries": view.backlog_entries(request.app[SHIM].scans.backlog())})
