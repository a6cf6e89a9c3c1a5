"""Model storage: fetch a model repository from s3, gs, http(s), pvc or local paths.

Two users: the storage initializer (``ferry-server download <uri> <dest>``, see :mod:`.cli`),
which the operator runs as an init container to fill ``/mnt/models``, and the server's cloud
model repository, which polls object stores through :func:`list_objects` and :func:`read`.
Scheme-specific code lives in :mod:`.s3`, :mod:`.gcs`, :mod:`.web` and :mod:`.local`;
:mod:`.operations` dispatches on the URI. Heavy clients (boto3, google-cloud-storage) are
imported only when a URI of their scheme is used.
"""

from serving_pod.storage.operations import download, list_objects, read
from serving_pod.storage.uris import ObjectInfo, StorageError, StorageUri, parse_uri

__all__ = [
    "ObjectInfo",
    "StorageError",
    "StorageUri",
    "download",
    "list_objects",
    "parse_uri",
    "read",
]
