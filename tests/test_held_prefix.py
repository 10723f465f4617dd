"""Text held back while it may be the start of a marker."""

from llama_chat.text.held_prefix import HeldPrefix


def test_a_marker_split_over_pieces_is_found_and_nothing_of_it_shown():
    held = HeldPrefix(["</think>"])
    assert held.feed("why </th") == ("why ", None)
    assert held.feed("in") == ("", None)
    assert held.feed("k>\n\nHi") == ("", "</think>")
    assert held.release() == "\n\nHi"  # what follows the marker stays for the caller


def test_a_false_start_is_released_once_it_can_no_longer_be_a_marker():
    held = HeldPrefix(["</end>"])
    assert held.feed("Hello </") == ("Hello ", None)
    assert held.feed("e") == ("", None)
    assert held.feed("x") == ("</ex", None)
    assert held.feed("and </en") == ("and ", None)
    assert held.feed("d> more") == ("", "</end>")
    held = HeldPrefix(["</end>"])
    assert held.feed("<") == ("", None)
    assert held.feed("<") == ("<", None)  # the first "<" can no longer start it; the second still can


def test_the_end_of_the_stream_releases_what_is_held():
    held = HeldPrefix(["<tool_call>"])
    assert held.feed("see <tool") == ("see ", None)
    assert held.release() == "<tool"
    assert held.release() == ""


def test_the_first_of_several_markers_wins_and_no_marker_holds_nothing():
    held = HeldPrefix(["STOP", "</s>", ""])
    assert held.feed("a </s> b STOP") == ("a ", "</s>")
    assert HeldPrefix([]).feed("any <text") == ("any <text", None)
    partial = HeldPrefix(["abc", "bx"])
    assert partial.feed("zab") == ("z", None)  # "ab" may begin abc; "b" alone may begin bx: the longer is held
