"""Strict validation of Kubernetes objects against the `kubernetes` client's models.

The client's model classes are generated from the Kubernetes OpenAPI spec:
each lists its fields (``attribute_map``) and their types (``openapi_types``).
:func:`validate` walks an object (a dict, as YAML renders it) through them and
reports every unknown field and every wrong type, which the client itself
ignores, then builds the typed model so the generated constructors check
required fields and enums. No cluster is needed; the e2e suite adds the
API server's own dry run on top.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

from kubernetes import client
from kubernetes.client import models

_LIST = re.compile(r"^(?:List\[|list\[)(.*)\]$")
_DICT = re.compile(r"^(?:Dict\[|dict\()str, (.*)[\])]$")


def model_name(api_version: str, kind: str) -> str:
    """``apps/v1`` + ``Deployment`` -> ``V1Deployment``; ``batch/v1beta1`` -> ``V1beta1...``."""
    version = api_version.rsplit("/", 1)[-1]
    return f"{version[0].upper()}{version[1:]}{kind}"


def validate(obj: dict[str, Any]) -> list[str]:
    """Problems of one built-in object (empty when valid).

    Raises:
        LookupError: the client has no model for the object's apiVersion/kind.
    """
    name = model_name(obj["apiVersion"], obj["kind"])
    if not hasattr(models, name):
        raise LookupError(f"no kubernetes model {name} for {obj['apiVersion']} {obj['kind']}")
    errors: list[str] = []
    _walk(obj, name, f"{obj['kind']}/{obj.get('metadata', {}).get('name')}", errors)
    if not errors:
        try:
            # The generated setters raise ValueError on a missing required field or a bad enum.
            client.ApiClient()._ApiClient__deserialize(obj, name)  # noqa: SLF001  (the client's own loader)
        except (ValueError, TypeError) as e:
            errors.append(f"{obj['kind']}: {e}")
    return errors


def _walk(value: Any, type_name: str, path: str, errors: list[str], in_map: bool = False) -> None:
    if value is None:
        return
    if m := _LIST.match(type_name):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _walk(item, m[1], f"{path}[{i}]", errors)
    elif m := _DICT.match(type_name):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        for key, item in value.items():
            _walk(item, m[1], f"{path}.{key}", errors, in_map=True)
    elif type_name == "str":
        # Map values of type string include resource quantities, which YAML may write as numbers.
        ok = isinstance(value, str) or (in_map and isinstance(value, (int, float)) and not isinstance(value, bool))
        if not ok:
            errors.append(f"{path}: expected a string, got {value!r}")
    elif type_name == "int":
        if not isinstance(value, int) or isinstance(value, bool):
            errors.append(f"{path}: expected an integer, got {value!r}")
    elif type_name == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            errors.append(f"{path}: expected a number, got {value!r}")
    elif type_name == "bool":
        if not isinstance(value, bool):
            errors.append(f"{path}: expected a boolean, got {value!r}")
    elif type_name in ("bytearray", "bytes"):
        # Secret data: base64 text in YAML/JSON.
        if not isinstance(value, str):
            errors.append(f"{path}: expected base64 text, got {value!r}")
    elif type_name in ("datetime", "date"):
        if not isinstance(value, (str, datetime.date)):
            errors.append(f"{path}: expected a timestamp, got {value!r}")
    elif type_name == "object":
        return  # free-form (IntOrString, JSON, RawExtension)
    else:
        cls = getattr(models, type_name)
        if not isinstance(value, dict):
            errors.append(f"{path}: expected an object ({type_name}), got {type(value).__name__}")
            return
        by_json = {json_key: attr for attr, json_key in cls.attribute_map.items()}
        for key, item in value.items():
            attr = by_json.get(key)
            if attr is None:
                errors.append(f"{path}.{key}: unknown field of {type_name}")
                continue
            _walk(item, cls.openapi_types[attr], f"{path}.{key}", errors)
