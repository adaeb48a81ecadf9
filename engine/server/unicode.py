"""Text that a JSON body can spell but that is not Unicode.

JSON can write a lone UTF-16 surrogate (``"\\ud800"``), and Python's json decoder
also lets a surrogate's UTF-8 bytes through. Such text cannot be encoded,
tokenized or logged, so ``not_unicode`` finds it anywhere in a parsed body,
field names included, and the request is refused with a 400 naming the field.
"""

from __future__ import annotations

from engine.server.errors import APIError


def not_unicode(data: object) -> APIError | None:
    """A 400 naming the first string of ``data`` (a parsed JSON value) that is not Unicode."""
    stack: list[tuple[str, object]] = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            error = _unencodable(path, value)
            if error is not None:
                return error
        elif isinstance(value, dict):
            items = []
            for key, item in value.items():
                where = _join(path, key.encode("utf-8", "backslashreplace").decode())
                error = _unencodable(where, key, "the field name")
                if error is not None:
                    return error
                items.append((where, item))
            stack.extend(reversed(items))
        elif isinstance(value, list):
            nested = [(_join(path, str(i)), v) for i, v in enumerate(value) if _nests(v)]
            stack.extend(reversed(nested))
    return None


def _nests(value: object) -> bool:
    return isinstance(value, str | dict | list)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _unencodable(path: str, text: str, what: str = "the text") -> APIError | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        char = ord(text[exc.start])
        return APIError(
            f"{path}: {what} is not valid Unicode: a lone UTF-16 surrogate "
            f"U+{char:04X} at character {exc.start}",
            param=path or None,
            code="invalid_unicode",
        )
    return None
