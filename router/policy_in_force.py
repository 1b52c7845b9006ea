"""The policy the router routes by now, and the profile it was built from. A new profile
(posted, or the profile file changed) is adopted whole from the next request on, with the
policy rebuilt around it; one that does not read as a profile, or that the policy refuses,
never comes into force."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specroute.policies.policy import Policy
from specroute.policies.profile import Profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import TOKENS_PER_BYTE

_log = logging.getLogger("specroute.router")
POSTED = "POST /router/profile"  # the source of a posted profile, as the status page says


class PolicyInForce:
    def __init__(
        self,
        policy: Policy,
        profile: Profile | None,
        source: str | None,
        params: Mapping[str, Any],
        digest: bytes = b"",
    ) -> None:
        """``params``: the configured parameters of the policy, which a new profile's policy
        is built with too; ``digest``: of the profile file as read at start, if any."""
        # the profile's crossover, over a configured one
        self.params = {k: v for k, v in params.items() if k != "crossover"}
        self.digest = digest  # of the profile file as last read
        self.adopt(policy, profile, source)

    def built(self, raw: Any) -> tuple[Policy, Profile]:
        """The policy in force rebuilt with the profile ``raw``; a ValueError (a bad profile,
        or a policy that refuses it) if it cannot be."""
        profile = parse_profile(raw)
        return build_policy(self.policy.name, self.params, profile), profile

    def adopt(self, policy: Policy, profile: Profile | None, source: str | None) -> None:
        """Route by a new policy from now on; requests in flight are not touched."""
        self.policy, self.profile, self.source = policy, profile, source
        self.loaded_at = time.time()
        axis = None if profile is None else profile.context
        # the profile's, for the KV tokens in flight
        self.tokens_per_byte = TOKENS_PER_BYTE if axis is None else axis.tokens_per_byte
        note = None if profile is None else profile.crossover.note
        if note:
            _log.warning("profile %s: %s", source, note)

    def reread(self, path: Path) -> bool:
        """The profile file again: adopted if it changed and reads as a profile the policy
        takes; kept out (the one in force stays) if not. Whether it was refused."""
        try:
            data = path.read_bytes()
        except OSError as exc:  # a mounted ConfigMap is swapped by a rename: gone a moment
            _log.warning("The profile file was not read (%s); the profile in force stays.", exc)
            return True
        digest = digest_of(data)
        if digest == self.digest:
            return False
        self.digest = digest
        try:
            policy, profile = self.built(json.loads(data))
        except ValueError as exc:  # bad JSON, ProfileError and PolicyError alike
            _log.warning(
                "The changed profile file was refused (%s); the profile in force stays.", exc
            )
            return True
        self.adopt(policy, profile, str(path))
        _log.warning("Profile file %s changed: crossover %g.", path, profile.crossover.threshold)
        return False


def digest_of(data: bytes) -> bytes:
    """What tells a file's new content from its old."""
    return hashlib.sha256(data).digest()
