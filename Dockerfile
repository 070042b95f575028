# The pipeline's one image: every application service of compose.yaml runs it with its own
# command (`pipeline intake`, `pipeline worker LINE`, `pipeline beat`, ...).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package is built from, named one by one (there is no .dockerignore).
WORKDIR /tmp/build
COPY pyproject.toml README.md ./
COPY app ./app
COPY workers ./workers
COPY beat ./beat
# A regular (not editable) install; the source then goes, so the installed copy is the
# only one a process can import.
RUN pip install --no-cache-dir . \
    && rm -rf /tmp/build

RUN useradd --create-home --user-group --uid 10001 --shell /usr/sbin/nologin pipeline
WORKDIR /home/pipeline
USER pipeline

# The intake and Flower.
EXPOSE 8000 5555

# compose.yaml names each service's command; on its own the image explains itself.
CMD ["pipeline", "--help"]
