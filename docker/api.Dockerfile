# The API image (also runs `accum db upgrade` and `accum token create`): slim Python, no torch.
#   docker build -f docker/api.Dockerfile -t accum-api .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Dependencies first: this layer is reused until the list changes.
COPY docker/api-requirements.txt /tmp/api-requirements.txt
RUN pip install -r /tmp/api-requirements.txt

# The package without its dependencies: torch, torchvision, numpy and scikit-learn stay out.
# Editable, so migrations/ and examples/ are found next to the code as in the repository.
COPY pyproject.toml README.md ./
COPY src ./src
COPY services ./services
COPY migrations ./migrations
COPY alembic.ini ./
COPY examples ./examples
RUN pip install --no-deps -e . \
    && python -c "import sys, services.api.main; assert 'torch' not in sys.modules, 'the API imported torch'"

RUN useradd --create-home --uid 1000 accum && mkdir -p /var/lib/accum/artifacts \
    && chown -R accum /var/lib/accum
USER accum

EXPOSE 8000
CMD ["uvicorn", "services.api.main:app", "--host", "0.0.0.0", "--port", "8000", "--no-proxy-headers", "--timeout-graceful-shutdown", "8"]
