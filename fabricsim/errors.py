"""The simulator's refusals: typed errors carrying their Redfish status and message.

Every way the simulator says no is a :class:`SimulatorError` subclass that
names its HTTP status and its registry message (``Composition.1.1.3.
ResourceBlockInUse``). The state model raises them; the HTTP layer turns them
into Redfish error bodies (:func:`error_body`); the in-process fake turns them
into the fabric protocol's error tree. So both adapters refuse the same things
the same way, from one table.

The message texts are the standard ones from DMTF's Base 1.22.1 and
Composition 1.1.3 registries (the tests compare them with the published
registries), reduced to the messages this service uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

REGISTRY_VERSIONS = {"Base": "1.22.1", "Composition": "1.1.3"}


@dataclass(frozen=True, slots=True)
class RegistryMessage:
    registry: str  # "Base" or "Composition"
    key: str  # "ResourceBlockInUse"
    text: str  # with %1, %2 ... placeholders
    severity: str
    resolution: str

    @property
    def message_id(self) -> str:
        return f"{self.registry}.{REGISTRY_VERSIONS[self.registry]}.{self.key}"

    def format(self, args: tuple[str, ...]) -> str:
        text = self.text
        # Replace %10 before %1, should a message ever have that many arguments.
        for index in range(len(args), 0, -1):
            text = text.replace(f"%{index}", args[index - 1])
        return text


def _m(registry: str, key: str, text: str, severity: str, resolution: str) -> RegistryMessage:
    return RegistryMessage(registry, key, text, severity, resolution)


# fmt: off
MESSAGES: dict[str, RegistryMessage] = {m.key: m for m in (
    _m("Base", "ResourceMissingAtURI", "The resource at the URI '%1' was not found.", "Critical", "Place a valid resource at the URI or correct the URI and resubmit the request."),  # noqa: E501
    _m("Base", "PreconditionFailed", "The ETag supplied did not match the ETag required to change this resource.", "Critical", "Try the operation again using the appropriate ETag."),  # noqa: E501
    _m("Base", "PreconditionRequired", "A precondition header or annotation is required to change this resource.", "Critical", "Try the operation again using an If-Match or If-None-Match header and appropriate ETag."),  # noqa: E501
    _m("Base", "PropertyValueTypeError", "The value '%1' for the property %2 is not a type that the property can accept.", "Warning", "Correct the value for the property in the request body and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "PropertyMissing", "The property %1 is a required property and must be included in the request.", "Warning", "Ensure that the property is in the request body and has a valid value and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "PropertyNotWritable", "The property %1 is a read-only property and cannot be assigned a value.", "Warning", "Remove the property from the request body and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "PropertyUnknown", "The property %1 is not in the list of valid properties for the resource.", "Warning", "Remove the unknown property from the request body and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "ActionParameterMissing", "The action %1 requires the parameter %2 to be present in the request body.", "Critical", "Supply the action with the required parameter in the request body when the request is resubmitted."),  # noqa: E501
    _m("Base", "ActionParameterValueTypeError", "The value '%1' for the parameter %2 in the action %3 is not a type that the parameter can accept.", "Warning", "Correct the value for the parameter in the request body and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "ActionParameterValueError", "The value for the parameter %1 in the action %2 is invalid.", "Warning", "Correct the value for the parameter in the request body and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "ActionParameterUnknown", "The action %1 was submitted with the invalid parameter %2.", "Warning", "Correct the invalid action parameter and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "PropertyValueError", "The value provided for the property %1 is not valid.", "Warning", "Correct the value for the property in the request body and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "ActionParameterValueNotInList", "The value '%1' for the parameter %2 in the action %3 is not in the list of acceptable values.", "Warning", "Choose a value from the enumeration list that the implementation can support and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "MalformedJSON", "The request body submitted was malformed JSON and could not be parsed by the receiving service.", "Critical", "Ensure that the request body is valid JSON and resubmit the request."),  # noqa: E501
    _m("Base", "ServiceTemporarilyUnavailable", "The service is temporarily unavailable.  Retry in %1 seconds.", "Critical", "Wait for the indicated retry duration and retry the operation."),  # noqa: E501
    _m("Base", "InternalError", "The request failed due to an internal service error.  The service is still operational.", "Critical", "Resubmit the request.  If the problem persists, consider resetting the service."),  # noqa: E501
    _m("Base", "NoValidSession", "There is no valid session established with the implementation.", "Critical", "Establish a session before attempting any operations."),  # noqa: E501
    _m("Base", "AccessUnauthorized", "Unauthorized.", "Critical", "Resubmit the request with valid credentials."),  # noqa: E501
    _m("Base", "ActionNotSupported", "The action %1 is not supported by the resource.", "Critical", "Check the Actions property in the resource for the supported actions."),  # noqa: E501
    _m("Base", "OperationNotAllowed", "The HTTP method is not allowed on this resource.", "Critical", "None."),  # noqa: E501
    _m("Base", "HeaderInvalid", "Header '%1' is invalid.", "Critical", "Resubmit the request with a valid request header."),  # noqa: E501
    _m("Base", "QueryParameterUnsupported", "Query parameter '%1' is not supported.", "Warning", "Correct or remove the query parameter and resubmit the request."),  # noqa: E501
    _m("Base", "QueryParameterValueFormatError", "The value '%1' for the parameter %2 is not a format that the parameter can accept.", "Warning", "Correct the value for the query parameter in the request and resubmit the request if the operation failed."),  # noqa: E501
    _m("Base", "Success", "The request completed successfully.", "OK", "None."),
    _m("Composition", "ResourceBlockInUse", "Resource block '%1' cannot be part of any new compositions.", "Warning", "Remove the resource block from the request and resubmit the request."),  # noqa: E501
    _m("Composition", "ResourceBlockNotFound", "Resource block '%1' was not found.", "Critical", "Remove the resource block and resubmit the request."),  # noqa: E501
    _m("Composition", "IncompatibleZone", "The requested resource blocks span multiple resource zones.", "Critical", "Request resource blocks from the same resource zone."),  # noqa: E501
    _m("Composition", "ResourceBlockInvalid", "Resource block '%1' is not valid.", "Critical", "Remove the resource block and resubmit the request."),  # noqa: E501
)}
# fmt: on


def message_info(key: str, args: tuple[str, ...] = ()) -> dict[str, Any]:
    """One ``@Message.ExtendedInfo`` entry (a Message.v1_3_0 object)."""
    message = MESSAGES[key]
    return {
        "@odata.type": "#Message.v1_3_0.Message",
        "MessageId": message.message_id,
        "Message": message.format(args),
        "MessageArgs": list(args),
        "MessageSeverity": message.severity,
        "Resolution": message.resolution,
    }


def error_body(key: str, args: tuple[str, ...] = ()) -> dict[str, Any]:
    """A Redfish error response body for one registry message."""
    info = message_info(key, args)
    return {
        "error": {
            "code": info["MessageId"],
            "message": info["Message"],
            "@Message.ExtendedInfo": [info],
        }
    }


class SimulatorError(Exception):
    """A refusal: the request changed nothing. Subclasses name status and message."""

    status: ClassVar[int] = 400
    message_key: ClassVar[str] = "InternalError"

    def __init__(self, *message_args: object) -> None:
        self.message_args = tuple(str(arg) for arg in message_args)
        super().__init__(MESSAGES[self.message_key].format(self.message_args))

    @property
    def message_id(self) -> str:
        return MESSAGES[self.message_key].message_id

    def body(self) -> dict[str, Any]:
        return error_body(self.message_key, self.message_args)


# --- Composition refusals (the state model raises these) --------------------


class ResourceMissing(SimulatorError):
    """No resource at this URI (an unknown system, say). Args: the URI."""

    status = 404
    message_key = "ResourceMissingAtURI"


class BlockNotFound(SimulatorError):
    """The referenced resource block does not exist. Args: its URI."""

    status = 404
    message_key = "ResourceBlockNotFound"


class BlockInUse(SimulatorError):
    """The block is composed into another system. Args: the block Id."""

    status = 409
    message_key = "ResourceBlockInUse"


class ZoneMismatch(SimulatorError):
    """The block shares no resource zone with the system."""

    message_key = "IncompatibleZone"


class BlockNotEnabled(SimulatorError):
    """The block (or the host's own block) is not Enabled. Args: the block Id."""

    status = 409
    message_key = "ResourceBlockInvalid"


class NotADeviceBlock(SimulatorError):
    """A ComputerSystem block where a device block belongs. Args: parameter, action."""

    message_key = "ActionParameterValueError"


class ActionNotSupported(SimulatorError):
    """A block action on a system that is not expandable. Args: the action's name."""

    message_key = "ActionNotSupported"


class NotOneComputeBlock(SimulatorError):
    """A composition request without exactly one compute block. Args: property path."""

    message_key = "PropertyValueError"


class OwnBlockRequired(SimulatorError):
    """A system's new block list without its own compute block, or with another's (or
    a block listed twice). Args: property path."""

    message_key = "PropertyValueError"


class ETagMismatch(SimulatorError):
    status = 412
    message_key = "PreconditionFailed"


class ETagRequired(SimulatorError):
    status = 428
    message_key = "PreconditionRequired"


# --- Malformed requests (the request parsers raise these) -------------------


class MalformedJSON(SimulatorError):
    message_key = "MalformedJSON"


class ActionParameterMissing(SimulatorError):
    """Args: action, parameter."""

    message_key = "ActionParameterMissing"


class ActionParameterValueTypeError(SimulatorError):
    """Args: value, parameter, action."""

    message_key = "ActionParameterValueTypeError"


class ActionParameterUnknown(SimulatorError):
    """Args: action, parameter."""

    message_key = "ActionParameterUnknown"


class ActionParameterValueNotInList(SimulatorError):
    """Args: value, parameter, action."""

    message_key = "ActionParameterValueNotInList"


class PropertyMissing(SimulatorError):
    """Args: property path."""

    message_key = "PropertyMissing"


class PropertyValueTypeError(SimulatorError):
    """Args: value, property path."""

    message_key = "PropertyValueTypeError"


class PropertyValueError(SimulatorError):
    """Args: property path. A value of the right type that the property cannot take."""

    message_key = "PropertyValueError"


class PropertyNotWritable(SimulatorError):
    """Args: property path."""

    message_key = "PropertyNotWritable"


class PropertyUnknown(SimulatorError):
    """Args: property path."""

    message_key = "PropertyUnknown"


class QueryParameterUnsupported(SimulatorError):
    """Args: the query parameter."""

    status = 501
    message_key = "QueryParameterUnsupported"


class QueryParameterValueFormatError(SimulatorError):
    """Args: value, parameter."""

    message_key = "QueryParameterValueFormatError"


class ODataVersionUnsupported(SimulatorError):
    """Args: the header as sent. DSP0266: an OData-Version we do not speak is a 412."""

    status = 412
    message_key = "HeaderInvalid"


class UnsupportedMediaType(SimulatorError):
    """Args: the header as sent. A request body that does not say it is JSON."""

    status = 415
    message_key = "HeaderInvalid"


# --- Service-level answers --------------------------------------------------


class NoValidSession(SimulatorError):
    status = 401
    message_key = "NoValidSession"


class AccessUnauthorized(SimulatorError):
    """Wrong user name or password at login."""

    status = 401
    message_key = "AccessUnauthorized"


class OperationNotAllowed(SimulatorError):
    status = 405
    message_key = "OperationNotAllowed"


class ServiceTemporarilyUnavailable(SimulatorError):
    """Args: seconds to wait."""

    status = 503
    message_key = "ServiceTemporarilyUnavailable"


class InternalError(SimulatorError):
    status = 500
    message_key = "InternalError"
