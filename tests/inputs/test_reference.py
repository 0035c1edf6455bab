from dataclasses import dataclass

from finetune_bench.inputs.reference import field_docs, section_reference


@dataclass
class Example:
    """An example section."""

    # Alone.
    first: int = 1
    # Shared by the two fields below it,
    # over two lines.
    second: str = "a"
    third: float = 0.5

    undocumented: bool = False


def test_a_comment_documents_the_fields_of_its_block_and_stops_at_a_blank_line():
    assert field_docs(Example) == {
        "first": "Alone.",
        "second": "Shared by the two fields below it, over two lines.",
        "third": "Shared by the two fields below it, over two lines.",
        "undocumented": "",
    }


def test_a_shared_comment_is_one_row_listing_its_fields():
    text = section_reference(Example, "example")
    assert "| `second`<br>`third` | str<br>float | `'a'`<br>`0.5` | Shared by the two fields below it" in text
    assert "| `first` | int | `1` | Alone. |" in text
    assert text.count("\n| `") == 3
