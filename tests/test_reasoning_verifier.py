"""The math verifier: answer extraction and equality on hand-written cases, including malformed and adversarial
answers, each of which must score (min or max) without raising."""

from __future__ import annotations

from fractions import Fraction

import pytest

from stages.reasoning_reward import answers_equal, extract_answer, last_boxed, math_reward, parse_number

EXTRACT = [
    ("82", "82"),
    ("so 37+45 = \\boxed{82}.", "82"),
    ("\\boxed{1} first, then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # several boxes: the last
    ("\\boxed{{1}+{2}}", "{1}+{2}"),  # nested braces
    ("The answer is 42.", "42"),
    ("I think 3, no 5. The answer is: -7/2\nbye", "-7/2"),
    ("the ANSWER IS 12 and then 99", "12 and then 99"),  # what follows the phrase, up to a sentence end
    ("steps 1, 2, 3 give 12.5", "12.5"),  # last number
    ("no digits here", None),
    ("", None),
    ("\\boxed{unclosed 5", "5"),  # an open box is ignored; the last number remains
]


@pytest.mark.parametrize("text,want", EXTRACT)
def test_extract_answer(text, want):
    assert extract_answer(text) == want


EQUAL = [
    ("82", "82", True), ("82.0", "82", True), ("1/2", "0.5", True), ("\\frac{1}{2}", "2/4", True),
    ("\\dfrac{3}{4}", "0.75", True), ("-\\frac{2}{3}", "-2/3", True), ("1,234", "1234", True), ("$5$", "5", True),
    ("81", "82", False), ("1/0", "0", False), ("x+1", "x + 1", True), ("abc", "abd", False), ("", "", False),
]


@pytest.mark.parametrize("a,b,want", EQUAL)
def test_answers_equal(a, b, want):
    assert answers_equal(a, b) is want


def test_parse_number_is_exact():
    assert parse_number("0.1") == Fraction(1, 10) and parse_number("-.5") == Fraction(-1, 2)
    assert parse_number("1,23") is None and parse_number("12a") is None


ADVERSARIAL = [
    "",  # empty
    "\\boxed{}",  # empty box
    "\\boxed{82}\\boxed{81}",  # several boxes, the last wrong
    "9" * 100_000,  # a huge number (Python refuses to parse ints over 4300 digits)
    "\\boxed{" + "1" * 5000 + "/" + "3" * 5000 + "}",
    "٨٢",  # Arabic-Indic digits for 82: not ASCII digits, so no number
    "８２",  # full-width digits
    "{" * 1000 + "}" * 999,
    "\\boxed{\\frac{}{}}",
    "the answer is",
    "\x00\uffff\ud7ff",
    "1e309",  # overflows a float
    "-" * 50 + "82",
]


@pytest.mark.parametrize("text", ADVERSARIAL)
def test_adversarial_answers_score_without_raising(text):
    assert math_reward(text, ["82"], 1.0, -1.0) in (1.0, -1.0)


def test_rewards_are_rlinf_plus_minus_values():
    assert math_reward("\\boxed{82}", ["82"]) == 1.0 and math_reward("81", ["82"]) == -1.0
    assert math_reward("\\boxed{82}\\boxed{81}", ["82"]) == -1.0  # the last box counts
    assert math_reward("", ["82"], 1.0, 0.0) == 0.0
    assert math_reward("0.5", ["3", "1/2"]) == 1.0  # any accepted reference
    assert last_boxed("\\fbox{7}") == "7"
