"""The nccl-tests units of labutils.core.busbw: exact sizes, bad values refused naming them."""

import pytest

from labutils.core import busbw
from labutils.core.inputs import LabInputError


def test_exact_sizes():
    assert busbw.parse_size("1234567890123456") == 1234567890123456
    assert busbw.parse_size("1.5K") == 1536


@pytest.mark.parametrize("call, name", [
    (lambda: busbw.GBps(1e6, 0), "seconds"),
    (lambda: busbw.GBps(-1, 1), "nbytes"),
    (lambda: busbw.parse_size("64Mb"), "bits"),
    (lambda: busbw.parse_size("1 kb"), "bits"),
    (lambda: busbw.parse_size(None), "size"),
    (lambda: busbw.parse_size(2**70), "size"),
])
def test_bad_values_are_refused_naming_them(call, name):
    with pytest.raises(LabInputError, match=name):
        call()
