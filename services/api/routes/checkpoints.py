"""A job's checkpoints: the list, and the file itself (ETag = its sha256)."""

from __future__ import annotations

from pathlib import Path as FilePath
from typing import Annotated
from urllib.parse import unquote, urlsplit

from fastapi import APIRouter, Header, HTTPException, Path, Response, status
from fastapi.responses import FileResponse

from services.api.auth import CurrentOwner
from services.api.deps import SessionDep, SettingsDep
from services.api.errors import problem_responses
from services.api.routes.jobs import NOT_FOUND, job_or_404
from services.api.schemas import MAX_INT32, CheckpointList, CheckpointPublic
from services.settings import Settings
from services.store import checkpoints as store_checkpoints

router = APIRouter(
    prefix="/v1/jobs",
    tags=["checkpoints"],
    responses=problem_responses(401, 422, 429, 503),
)


def checkpoint_path(settings: Settings, uri: str) -> FilePath:
    """The local file of a checkpoint row: a `file://` URI, an absolute path, or a path
    relative to ACCUM_ARTIFACTS_DIR."""
    path = FilePath(unquote(urlsplit(uri).path)) if uri.startswith("file://") else FilePath(uri)
    return path if path.is_absolute() else settings.artifacts_path / path


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or etag in tags


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, responses=NOT_FOUND)
def list_checkpoints(*, session: SessionDep, owner: CurrentOwner, job_id: str) -> CheckpointList:
    """The job's retained checkpoints, oldest step first."""
    job_or_404(session, job_id, owner)
    rows = store_checkpoints.list_checkpoints(session, job_id)
    return CheckpointList(items=[CheckpointPublic.model_validate(c) for c in rows])


@router.get(
    "/{job_id}/checkpoints/{step}",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The checkpoint file"},
        304: {"description": "If-None-Match matched: you have this file"},
        **NOT_FOUND,
    },
)
def download_checkpoint(
    *,
    session: SessionDep,
    owner: CurrentOwner,
    settings: SettingsDep,
    job_id: str,
    step: Annotated[int, Path(ge=0, le=MAX_INT32)],
    if_none_match: Annotated[str | None, Header()] = None,
) -> Response:
    """The checkpoint file (`torch.load` it; model weights under `model`)."""
    job_or_404(session, job_id, owner)
    row = store_checkpoints.get_checkpoint(session, job_id, step)
    if row is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"job {job_id} has no checkpoint at step {step}; "
            f"list them with GET /v1/jobs/{job_id}/checkpoints",
        )
    etag = f'"{row.sha256}"'
    if etag_matches(if_none_match, etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
    path = checkpoint_path(settings, row.uri)
    if not path.is_file():
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"the file of checkpoint {job_id}/{step} is gone (pruned or moved); "
            "download a later checkpoint",
        )
    return FileResponse(
        path,
        media_type="application/octet-stream",
        filename=f"{job_id}-{step}.pt",
        headers={"ETag": etag},
    )
