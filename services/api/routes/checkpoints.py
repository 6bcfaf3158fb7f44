"""A job's checkpoints: the list, and the object itself streamed from the artifact store
(ETag = its sha256, single byte ranges), or with ``ACCUM_DOWNLOAD_REDIRECT=1`` on an S3 store a
307 to a short-lived presigned URL (clients verify the sha256 either way). A sharded (FSDP)
checkpoint is served as its consolidated file, which the worker wrote when the shards were
small enough (``ACCUM_CONSOLIDATE_MAX_BYTES``); one with shards only answers 409 with how to
consolidate them."""

from __future__ import annotations

import re
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Path, Response, status
from fastapi.responses import RedirectResponse, StreamingResponse

from services.api.auth import CurrentOwner
from services.api.deps import ArtifactsDep, SessionDep, SettingsDep
from services.api.errors import Problem, problem_responses
from services.api.routes.jobs import NOT_FOUND, job_or_404
from services.api.schemas import MAX_INT32, CheckpointList, CheckpointPublic
from services.artifacts import (
    ArtifactStore,
    StoreUnavailable,
    consolidated_key,
    is_sharded_key,
    merged_key,
)
from services.jobdb import checkpoints as store_checkpoints

router = APIRouter(
    prefix="/v1/jobs",
    tags=["checkpoints"],
    responses=problem_responses(401, 422, 429, 503),
)

RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = {t.strip().removeprefix("W/") for t in if_none_match.split(",")}
    return "*" in tags or etag in tags


def byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    """``[start, end)`` of a single ``Range: bytes=a-b`` (or ``a-``, ``-n``); None for the whole
    object (no header, or one this does not serve: several ranges); 416 when unsatisfiable."""
    match = RANGE.match(header.strip()) if header else None
    if match is None:
        return None
    first, last = match.groups()
    if first:
        start, end = int(first), (int(last) + 1 if last else size)
    elif last:
        start, end = max(0, size - int(last)), size
    else:
        return None
    if start >= size or end <= start:
        raise Problem(status.HTTP_416_RANGE_NOT_SATISFIABLE,
                      detail=f"range {header} is outside the {size} bytes of this checkpoint",
                      headers={"Content-Range": f"bytes */{size}"})
    return start, min(end, size)


@router.get("/{job_id}/checkpoints", response_model=CheckpointList, responses=NOT_FOUND)
def list_checkpoints(*, session: SessionDep, owner: CurrentOwner, job_id: str) -> CheckpointList:
    """The job's retained checkpoints, oldest step first."""
    job_id = job_or_404(session, job_id, owner).id  # the path may hold a prefix of it
    rows = store_checkpoints.list_checkpoints(session, job_id)
    return CheckpointList(items=[CheckpointPublic.model_validate(c) for c in rows])


@router.get(
    "/{job_id}/checkpoints/{step}",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The checkpoint file"},
        206: {"description": "The bytes the Range header asked for"},
        304: {"description": "If-None-Match matched: you have this file"},
        307: {"description": "ACCUM_DOWNLOAD_REDIRECT=1: a presigned URL on the S3 store"},
        **NOT_FOUND,
        **problem_responses((409, "A sharded checkpoint without a consolidated file: the detail says how to get one")),
    },
)
def download_checkpoint(
    *,
    session: SessionDep,
    owner: CurrentOwner,
    settings: SettingsDep,
    store: ArtifactsDep,
    job_id: str,
    step: Annotated[int, Path(ge=0, le=MAX_INT32)],
    if_none_match: Annotated[str | None, Header()] = None,
    range: Annotated[str | None, Header()] = None,  # noqa: A002  (the header's name)
) -> Response:
    """The checkpoint file (`torch.load` it; model weights under `model`)."""
    job_id = job_or_404(session, job_id, owner).id  # the path may hold a prefix of it
    row = store_checkpoints.get_checkpoint(session, job_id, step)
    if row is None:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"job {job_id} has no checkpoint at step {step}; "
            f"list them with GET /v1/jobs/{job_id}/checkpoints",
        )
    key, sha256 = row.key, row.sha256
    session.close()  # streaming may take minutes: give the connection back first
    etag = f'"{sha256}"'
    if etag_matches(if_none_match, etag):
        return Response(status_code=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag})
    try:
        if is_sharded_key(key):
            key = served_file_of_shards(store, key, job_id, step)
        if settings.download_redirect and (url := store.presign(key, settings.presign_expires_s)):
            return RedirectResponse(url, status.HTTP_307_TEMPORARY_REDIRECT, headers={"ETag": etag})
        stored = store.head(key)
        if stored is None:
            raise HTTPException(
                status.HTTP_404_NOT_FOUND,
                detail=f"the object of checkpoint {job_id}/{step} ({key}) is gone from the "
                "artifact store (pruned or deleted); download a later checkpoint",
            )
        span = byte_range(range, stored.size)
        start, end = span or (0, stored.size)
        chunks = store.open(key, start, end)
    except StoreUnavailable as exc:
        raise Problem(status.HTTP_503_SERVICE_UNAVAILABLE, "Artifact Store Unavailable",
                      f"{exc}; retry later", headers={"Retry-After": "5"}) from exc
    headers = {
        "ETag": etag,
        "Accept-Ranges": "bytes",
        "Content-Length": str(end - start),
        "Content-Disposition": f'attachment; filename="{job_id}-{step}.pt"',
    }
    if span is not None:
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{stored.size}"
    return StreamingResponse(chunks, status_code=206 if span else 200, headers=headers,
                             media_type="application/octet-stream")


@router.get(
    "/{job_id}/merged",
    response_class=StreamingResponse,
    responses={200: {"content": {"application/x-tar": {}}, "description": "The merged model's files"}, **NOT_FOUND},
)
def download_merged(*, session: SessionDep, owner: CurrentOwner, store: ArtifactsDep, job_id: str) -> Response:
    """A LoRA job's final model with its adapters merged (spec `peft.merge`): a tar of its
    `save_pretrained` folder; `tar xf` it and `from_pretrained("merged")`."""
    job = job_or_404(session, job_id, owner)
    job_id, peft = job.id, (job.spec or {}).get("peft") or {}
    session.close()
    try:
        stored = store.head(merged_key(job_id))
        if stored is None:
            why = ("its spec has no peft.merge: true" if not peft.get("merge")
                   else "it has not finished training yet (the merged model is written at its end)")
            raise HTTPException(status.HTTP_404_NOT_FOUND,
                                detail=f"job {job_id} has no merged model: {why}; its adapters are in its "
                                f"checkpoints (GET /v1/jobs/{job_id}/checkpoints)")
        sha256 = stored.sha256 or merged_sha256(store, job_id)
        chunks = store.open(merged_key(job_id), 0, stored.size)
    except StoreUnavailable as exc:
        raise Problem(status.HTTP_503_SERVICE_UNAVAILABLE, "Artifact Store Unavailable",
                      f"{exc}; retry later", headers={"Retry-After": "5"}) from exc
    headers = {"Content-Length": str(stored.size),
               "Content-Disposition": f'attachment; filename="{job_id}-merged.tar"',
               **({"ETag": f'"{sha256}"'} if sha256 else {})}
    return StreamingResponse(chunks, headers=headers, media_type="application/x-tar")


def merged_sha256(store: ArtifactStore, job_id: str) -> str | None:
    """The merged model's sha256, which the worker stores beside it (``<key>.sha256``)."""
    key = merged_key(job_id) + ".sha256"
    if store.head(key) is None:
        return None
    return b"".join(store.open(key)).decode().strip() or None


def served_file_of_shards(store: ArtifactStore, manifest: str, job_id: str, step: int) -> str:
    """The consolidated file of a sharded checkpoint (its manifest's key): 409 when the
    worker stored shards only."""
    key = consolidated_key(manifest)
    if store.head(key) is None:
        folder = manifest.rsplit("/", 1)[0]
        raise Problem(
            status.HTTP_409_CONFLICT, "Checkpoint Has Shards Only",
            f"checkpoint {job_id}/{step} is sharded (FSDP) and has no consolidated file: its shards "
            "were larger than the workers' ACCUM_CONSOLIDATE_MAX_BYTES. Copy the folder "
            f"{store.url}/{folder}/ and run accumcore.consolidate_checkpoint(folder, 'full.pt') "
            "(or torch.distributed.checkpoint.format_utils.dcp_to_torch_save); or start a job from it "
            f'with init_from: {{"job": "{job_id}", "step": {step}}}, which loads the shards',
        )
    return key
