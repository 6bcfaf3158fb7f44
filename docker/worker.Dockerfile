# The GPU worker image: the PyTorch CUDA runtime image plus accum.
#   docker build -f docker/worker.Dockerfile -t accum-worker .
# Pick the base that matches the nodes' driver (CUDA 12.4 needs driver >= 550):
#   docker build --build-arg BASE=pytorch/pytorch:2.5.1-cuda12.1-cudnn9-runtime ...
ARG BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

COPY pyproject.toml README.md ./
COPY src ./src
COPY services ./services
COPY migrations ./migrations
COPY examples ./examples
# pyproject asks for torch/torchvision ranges, which the base image's CUDA build satisfies,
# so pip keeps them instead of pulling a CPU wheel. The check fails the build if it did not.
RUN python -c "import torch; print('base torch', torch.__version__)" > /tmp/torch-before \
    && pip install -e '.[models,s3,gpu,trackers]' \
    && python -c "import torch; print('base torch', torch.__version__)" | cmp - /tmp/torch-before

RUN useradd --create-home --uid 1000 accum && mkdir -p /var/lib/accum/artifacts /var/lib/accum/cache /var/lib/accum/data \
    && chown -R accum /var/lib/accum
USER accum

# One worker per GPU: compose reserves the GPU; --gpus 0 pins it when run by hand.
CMD ["accum", "worker", "--queues", "default"]
