"""The readers' one door for files: the text, or one line naming the parameter and why not."""

import pytest

from labutils.core.inputs import LabInputError
from labutils.readers.sources import read_text


def test_the_text_comes_back_with_undecodable_bytes_replaced(tmp_path):
    path = tmp_path / "log.txt"
    path.write_bytes(b"GPU0\t X \n\xff\n")
    assert read_text(path, "log") == "GPU0\t X \n\ufffd\n"


@pytest.mark.parametrize("make, words", [
    (lambda d: "", "log='' names no file"),
    (lambda d: d, "is a directory (a folder), not a file"),
    (lambda d: d / "missing.log", "does not exist"),
    (lambda d: "/dev/null", "is not a regular file"),
    (lambda d: "bad\0name", "does not exist"),
])
def test_what_cannot_be_read_is_one_line_naming_it(tmp_path, make, words):
    with pytest.raises(LabInputError, match="; give the log") as info:
        read_text(make(tmp_path), "log", "; give the log")
    assert words in str(info.value) and str(info.value).startswith("log=") and "\n" not in str(info.value)
