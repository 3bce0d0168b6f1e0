"""Request bodies sent with ``Content-Encoding: gzip`` or ``deflate`` (tritonclient offers both:
``request_compression_algorithm``), decoded with a bound.

A compressed body is small on the wire and may be huge inflated (a 1 MB gzip can hold 1 GB of
zeros), so it is inflated at most to the server's ``--max-body-bytes`` plus one byte: past that
the request is 413, as a plain body that large would be, and no more memory is spent on it.
``deflate`` is the zlib format (RFC 1950, what tritonclient and most clients send); the raw
deflate stream some clients send under that name is accepted too. ``identity`` is the body as
is. Any other coding, or a list of codings, is 415 with the ones understood named, rather than
a body parsed as if it were plain. A stream that is corrupt or cut short is 400.
"""

from __future__ import annotations

import zlib

from serving.errors import BodyTooLarge, InvalidRequest, UnsupportedMediaType

SUPPORTED = ("gzip", "deflate", "identity")
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decode_body(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` as sent with ``Content-Encoding: encoding``, inflated to at most ``limit``
    bytes; :class:`BodyTooLarge`, :class:`UnsupportedMediaType` or :class:`InvalidRequest`."""
    coding = encoding.strip().lower()
    if coding in ("", "identity"):
        return body
    wbits = _WBITS.get(coding)
    if wbits is None:
        raise UnsupportedMediaType(f"Content-Encoding {encoding!r} is not supported; send "
                                   f"one of {', '.join(SUPPORTED)}")
    try:
        return _inflate(body, wbits, limit, coding)
    except zlib.error:
        if coding != "deflate":
            raise InvalidRequest(f"the {coding} request body is corrupt") from None
    try:  # "deflate" as a raw stream, without the zlib header
        return _inflate(body, -zlib.MAX_WBITS, limit, coding)
    except zlib.error:
        raise InvalidRequest("the deflate request body is corrupt") from None


def _inflate(body: bytes, wbits: int, limit: int, coding: str) -> bytes:
    inflater = zlib.decompressobj(wbits)
    out = inflater.decompress(body, limit + 1)
    if len(out) > limit or inflater.unconsumed_tail:
        raise BodyTooLarge(f"the {coding} request body inflates past the {limit} byte limit "
                           "(--max-body-bytes); send fewer rows per request")
    out += inflater.flush()
    if len(out) > limit:
        raise BodyTooLarge(f"the {coding} request body inflates past the {limit} byte limit "
                           "(--max-body-bytes); send fewer rows per request")
    if not inflater.eof:
        raise InvalidRequest(f"the {coding} request body ends before its stream does")
    return out
