"""Sizes and bandwidths (labutils.core.units): exact sizes, bad values refused naming them."""

import pytest

from labutils.core import units
from labutils.core.inputs import LabInputError


def test_exact_sizes():
    assert units.parse_size("1234567890123456") == 1234567890123456
    assert units.parse_size("1.5K") == 1536


@pytest.mark.parametrize("call, name", [
    (lambda: units.GBps(1e6, 0), "seconds"),
    (lambda: units.GBps(-1, 1), "nbytes"),
    (lambda: units.parse_size("64Mb"), "bits"),
    (lambda: units.parse_size("1 kb"), "bits"),
    (lambda: units.parse_size(None), "size"),
    (lambda: units.parse_size(2**70), "size"),
])
def test_bad_values_are_refused_naming_them(call, name):
    with pytest.raises(LabInputError, match=name):
        call()
