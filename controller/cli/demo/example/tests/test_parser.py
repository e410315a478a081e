from calc.parser import parse_items


def test_items_are_split_and_stripped():
    assert parse_items("a, b,c") == ["a", "b", "c"]


def test_empty_input_gives_no_items():
    assert parse_items("") == []


def test_blank_input_gives_no_items():
    assert parse_items("   ") == []
