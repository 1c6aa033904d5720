#!/usr/bin/env python3
"""ddprun_testlib against bytes written out by hand (the layout of
rendezvous/include/ddprun/rdzv/agent_protocol.h), so a mistake in the shared framing shows here
and not as a puzzling failure of a test that uses it."""
import os
import socket
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ddprun_testlib as t  # noqa: E402

# SUCCEEDED {"round": 3}: u32 length 31 (1 + 8 + 8 + 5 + 8 + 1), type 4, u64 count 1, u64 5 "round", u64 1 "3".
SUCCEEDED_ROUND_3 = (b"\x1f\x00\x00\x00" b"\x04" b"\x01" + b"\x00" * 7 +
                     b"\x05" + b"\x00" * 7 + b"round" + b"\x01" + b"\x00" * 7 + b"3")


class Framing(unittest.TestCase):
    def test_hello_is_a_zero_byte_and_the_magic(self):
        self.assertEqual(t.AGENT_HELLO, b"\x00DDPR")

    def test_a_frame_byte_for_byte(self):
        self.assertEqual(t.agent_frame(t.SUCCEEDED, {"round": 3}), SUCCEEDED_ROUND_3)
        self.assertEqual(t.agent_frame(t.SUCCEEDED, {b"round": b"3"}), SUCCEEDED_ROUND_3)
        self.assertEqual(t.agent_frame(t.LEAVE, {}), b"\x09\x00\x00\x00\x05" + b"\x00" * 8)

    def test_parse_waits_for_a_whole_frame_and_returns_the_rest(self):
        two = SUCCEEDED_ROUND_3 + t.agent_frame(t.ROUND, {"round": "7", "world_size": "2"})
        for cut in range(len(SUCCEEDED_ROUND_3)):
            self.assertIsNone(t.parse_agent_frame(two[:cut]))
        msg_type, fields, rest = t.parse_agent_frame(two)
        self.assertEqual((msg_type, fields), (t.SUCCEEDED, {"round": "3"}))
        self.assertEqual(t.parse_agent_frame(rest), (t.ROUND, {"round": "7", "world_size": "2"}, b""))

    def test_read_takes_one_frame_from_a_socket_and_says_when_it_closed(self):
        a, b = socket.socketpair()
        with a, b:
            a.sendall(SUCCEEDED_ROUND_3 + t.agent_frame(t.ERROR, {"message": "no"}))
            self.assertEqual(t.read_agent_frame(b), (t.SUCCEEDED, {"round": "3"}))
            self.assertEqual(t.read_agent_frame(b), (t.ERROR, {"message": "no"}))
            a.shutdown(socket.SHUT_WR)
            with self.assertRaisesRegex(AssertionError, "closed the connection"):
                t.read_agent_frame(b)


class FreePort(unittest.TestCase):
    def test_the_port_can_be_bound(self):
        for host in ("127.0.0.1", ""):
            port = t.free_port(host)
            self.assertGreater(port, 0)
            with socket.socket() as s:
                s.bind((host, port))


if __name__ == "__main__":
    unittest.main(verbosity=2)
