"""The opening of a versioned JSON annotation value: each refusal names its place."""

from __future__ import annotations

import pytest

from gpufrag.errors import BadInput
from gpufrag.jsondoc import versioned_object


def test_an_object_of_the_known_version_is_returned_whole() -> None:
    assert versioned_object('{"version": 2, "a": [1]}', 2, source="s") == {"version": 2,
                                                                           "a": [1]}


@pytest.mark.parametrize(("text", "field", "words"), [
    ("{not json", None, "not valid JSON"),
    ("[1, 2]", "(root)", "expected an object"),
    ('{"version": 3}', "version", "schema version 3 is not supported (this reader knows 2)"),
    ("{}", "version", "schema version None is not supported"),
])
def test_a_bad_value_is_bad_input_naming_source_and_field(text: str, field: str | None,
                                                          words: str) -> None:
    with pytest.raises(BadInput) as refused:
        versioned_object(text, 2, source="annotation a")
    assert (refused.value.source, refused.value.field) == ("annotation a", field)
    assert words in str(refused.value)
