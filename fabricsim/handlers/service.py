"""The service's documents: version list, ``$metadata``, our OEM schema, every
read-only resource, and 404 for anything else."""

from __future__ import annotations

from .. import resources, uris
from ..errors import OperationNotAllowed, ResourceMissing
from ..metadata import OEM_SCHEMA_DOCUMENT, metadata_document
from .base import RedfishHandler


class VersionsHandler(RedfishHandler):
    def is_open(self) -> bool:
        return True

    def get(self) -> None:
        self.send_json({"v1": uris.SERVICE_ROOT})


class MetadataHandler(RedfishHandler):
    """The open CSDL document ``$metadata``."""

    def is_open(self) -> bool:
        return True

    def get(self) -> None:
        self.send_xml(metadata_document())


class OemSchemaHandler(MetadataHandler):
    """Our OEM schema, referenced from ``$metadata``."""

    def get(self) -> None:
        self.send_xml(OEM_SCHEMA_DOCUMENT)


class ResourceHandler(RedfishHandler):
    """GET of any read-only resource; other methods are not allowed."""

    def is_open(self) -> bool:
        path = self.request.path.rstrip("/")
        is_public = path in (uris.ROOT, uris.ODATA)
        # An expanded service root would show protected resources.
        return (
            is_public
            and self.request.method in ("GET", "HEAD")
            and "$expand" not in (self.request.query_arguments)
        )

    def get(self, path: str) -> None:
        self.send_resource(resources.render(self.sim.view, self.request.path))

    def _not_allowed(self, path: str) -> None:
        if resources.render(self.sim.view, self.request.path) is None:
            raise ResourceMissing(self.request.path)
        raise OperationNotAllowed()

    post = put = patch = delete = _not_allowed


class NotFoundHandler(RedfishHandler):
    """Anything outside ``/redfish/v1``: 404."""

    def is_open(self) -> bool:
        return True

    def _missing(self, *args: str) -> None:
        raise ResourceMissing(self.request.path)

    get = head = post = put = patch = delete = _missing
