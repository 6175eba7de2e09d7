"""Reading EC2 query-protocol requests and writing EC2 XML answers.

EC2 requests are form-encoded: lists and structures are flattened into numbered keys
(``Filter.1.Name``, ``Filter.1.Value.2``, ``TagSpecification.1.Tag.1.Key``). These helpers turn
such a flat ``dict[str, str]`` back into lists, and write the two XML documents botocore's ``ec2``
parser expects: ``<ActionResponse>`` for a result and ``<Response><Errors>`` for an error.
"""

from __future__ import annotations

import uuid
from xml.sax.saxutils import escape

EC2_XMLNS = "http://ec2.amazonaws.com/doc/2016-11-15/"


class Ec2Error(Exception):
    """An EC2 error answer: botocore raises ``ClientError`` with this code."""

    def __init__(self, code: str, message: str, status: int = 400) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status


def indexed(params: dict[str, str], prefix: str) -> list[dict[str, str]]:
    """The members of a flattened list of structures, in index order.

    ``indexed({"Filter.1.Name": "a", "Filter.1.Value.1": "b"}, "Filter")`` is
    ``[{"Name": "a", "Value.1": "b"}]``.
    """
    members: dict[int, dict[str, str]] = {}
    head = prefix + "."
    for key, value in params.items():
        if not key.startswith(head):
            continue
        index, _, rest = key[len(head) :].partition(".")
        if index.isdigit() and rest:
            members.setdefault(int(index), {})[rest] = value
    return [members[i] for i in sorted(members)]


def listed(params: dict[str, str], prefix: str) -> list[str]:
    """The values of a flattened list of strings (``GroupName.1``, ``GroupName.2``), in order."""
    head = prefix + "."
    found = {
        int(key[len(head) :]): value
        for key, value in params.items()
        if key.startswith(head) and key[len(head) :].isdigit()
    }
    return [found[i] for i in sorted(found)]


def filters(params: dict[str, str]) -> dict[str, list[str]]:
    """``Filter.N.Name`` / ``Filter.N.Value.M`` as ``{name: [values]}``."""
    return {f["Name"]: listed(f, "Value") for f in indexed(params, "Filter") if "Name" in f}


def tag_specification(params: dict[str, str], resource_type: str) -> dict[str, str]:
    """The tags that ``TagSpecification.N`` gives to ``resource_type``.

    Raises ``Ec2Error`` for a specification of another resource type, as EC2 does.
    """
    tags: dict[str, str] = {}
    for spec in indexed(params, "TagSpecification"):
        if spec.get("ResourceType") != resource_type:
            raise Ec2Error(
                "InvalidParameterValue",
                f"'{spec.get('ResourceType')}' is not a valid taggable resource type "
                "for this operation.",
            )
        for tag in indexed(spec, "Tag"):
            tags[tag.get("Key", "")] = tag.get("Value", "")
    return tags


def request_id() -> str:
    return str(uuid.uuid4())


def response_xml(action: str, body: str) -> bytes:
    """A successful EC2 answer to ``action`` whose result members are ``body`` (XML)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<{action}Response xmlns="{EC2_XMLNS}">'
        f"<requestId>{request_id()}</requestId>{body}</{action}Response>"
    ).encode()


def error_xml(code: str, message: str) -> bytes:
    """EC2's error document (not the ``<ErrorResponse>`` of other query services)."""
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Response><Errors><Error><Code>{escape(code)}</Code>"
        f"<Message>{escape(message)}</Message></Error></Errors>"
        f"<RequestID>{request_id()}</RequestID></Response>"
    ).encode()


def element(name: str, value: str | int | None) -> str:
    """``<name>value</name>``, or nothing for ``None``."""
    return "" if value is None else f"<{name}>{escape(str(value))}</{name}>"


def tag_set(tags: dict[str, str]) -> str:
    items = "".join(
        f"<item>{element('key', k)}{element('value', v)}</item>" for k, v in tags.items()
    )
    return f"<tagSet>{items}</tagSet>"
