"""An in-memory Cloud Storage for tests: gcp-storage-emulator (the [test] extra) served from a
thread of this process, with the variables that point gcsfs, google-cloud-storage and
tensorstore (orbax's arrays) at it.

One repair: the emulator's media downloads lack the `x-goog-generation` header of real GCS,
which tensorstore reads (without it every read is "Malformed StorageGeneration"); it is added
here. The emulator ignores `ifGenerationMatch` preconditions, so it suits one writer at a time."""

import contextlib
import os
import socket

from gcp_storage_emulator import server as emulator_server
from gcp_storage_emulator.handlers import objects


_download = objects.download


def _download_with_generation(request, response, storage, *args, **kwargs):
  with contextlib.suppress(Exception):   # a missing object: the emulator's own 404 follows
    obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    response["x-goog-generation"] = str(obj["generation"])
    response["x-goog-metageneration"] = str(obj["metageneration"])
  _download(request, response, storage, *args, **kwargs)


objects.download = _download_with_generation   # `objects.get` with alt=media calls it by name
for _, _handlers in emulator_server.HANDLERS:
  for _method, _handler in list(_handlers.items()):
    if _handler is _download:
      _handlers[_method] = _download_with_generation


@contextlib.contextmanager
def serve(bucket: str):
  """Yields 'gs://BUCKET', served in memory until the context ends (the variables restored)."""
  with contextlib.closing(socket.socket()) as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  server = emulator_server.create_server("127.0.0.1", port, in_memory=True, default_bucket=bucket)
  server.start()
  url = f"http://127.0.0.1:{port}"
  env = dict(STORAGE_EMULATOR_HOST=url,            # gcsfs and google-cloud-storage
             TENSORSTORE_GCS_HTTP_URL=url,          # tensorstore's gcs driver (orbax's arrays)
             GOOGLE_AUTH_TOKEN_FOR_TESTING="emulator")
  saved = {k: os.environ.get(k) for k in env}
  os.environ.update(env)
  try:
    yield f"gs://{bucket}"
  finally:
    server.stop()
    for key, value in saved.items():
      if value is None:
        os.environ.pop(key, None)
      else:
        os.environ[key] = value
