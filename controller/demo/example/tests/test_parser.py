import unittest

from calc.parser import parse_items


class ParseItemsTest(unittest.TestCase):
    def test_items(self):
        self.assertEqual(parse_items("a, b,c"), ["a", "b", "c"])

    def test_empty_input_gives_no_items(self):
        self.assertEqual(parse_items(""), [])


if __name__ == "__main__":
    unittest.main()
