"""The math verifier: answer extraction and equality on hand-written cases, including malformed and adversarial
answers, each of which must score (min or max) without raising; and reward.verifier math_verify (skipped without the
[math] extra) on fractions, LaTeX, equivalent forms, units, and a pathological answer that must time out."""

from __future__ import annotations

import threading
from fractions import Fraction

import pytest

from stages.math_verify_judge import close_pool, math_verify_equal
from stages.reasoning_reward import answers_equal, extract_answer, is_correct, last_boxed, math_reward, parse_number

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


# --- reward.verifier: math_verify (HF's math-verify, the [math] extra) ---------------------------------------------

MATH_VERIFY = [
    ("\\boxed{\\frac{1}{2}}", ["0.5"], True), ("\\boxed{\\frac12}", ["1/2"], True),  # fractions
    ("so $x = \\dfrac{3}{4}$", ["0.75"], True), ("\\boxed{\\frac{2}{3}}", ["0.6667"], False),
    ("\\boxed{\\sqrt{2}/2}", ["\\frac{1}{\\sqrt{2}}"], True),  # LaTeX, equal after simplifying
    ("\\boxed{(x+1)^2}", ["x^2+2x+1"], True), ("\\boxed{x^2+1}", ["x^2+2x+1"], False),  # equivalent forms
    ("\\boxed{5\\text{ cm}}", ["5"], True), ("\\boxed{3 \\text{ meters}}", ["3"], True),  # units
    ("The answer is $\\boxed{52}$", ["052"], True), ("\\boxed{51}", ["52"], False),
    ("no answer here", ["52"], False), ("", ["52"], False),
]


@pytest.mark.parametrize("text,refs,want", MATH_VERIFY)
def test_math_verify_cases(text, refs, want):
    pytest.importorskip("math_verify")
    assert is_correct(text, refs, "math_verify") is want
    assert math_reward(text, refs, 1.0, -1.0, "math_verify") == (1.0 if want else -1.0)


PATHOLOGICAL = "\\boxed{9^{9^{9^{9^{9}}}}}"  # a tower sympy would evaluate for ever


def test_math_verify_times_out_on_a_pathological_answer_in_the_main_thread():
    pytest.importorskip("math_verify")
    assert math_verify_equal(PATHOLOGICAL, ["1"], timeout_s=1) is False  # returns (a hang meets pytest's timeout)


def test_math_verify_times_out_in_a_worker_thread_too():
    # an inline-backend rank is a thread: no SIGALRM there, so the call runs in a process that is killed at the bound
    pytest.importorskip("math_verify")
    got = []

    def call():
        math_verify_equal("\\boxed{1/2}", ["0.5"], timeout_s=1)  # the pool's process starts (once)
        got.append(math_verify_equal(PATHOLOGICAL, ["1"], timeout_s=1))
        got.append(math_verify_equal("\\boxed{1/2}", ["0.5"], timeout_s=1))  # a fresh process after the kill

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(90)  # a hang guard, not a speed check
    close_pool()  # no process outlives a test
    assert not thread.is_alive() and got == [False, True]
