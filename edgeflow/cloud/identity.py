"""Who is calling: a caller's identity comes from its credential, never from what it claims.

Credentials (`edgeflow serve --token-file FILE`, `--tls-client-ca PEM`):

- A token file of one bare token: one shared identity (a single-tenant deployment, as
  before): every caller with the token is trusted alike, and the device id a training
  step names is used as sent.
- A token file of per-device lines, one token each (`#` starts a comment)::

      # TOKEN                 DEVICE_ID   [MODEL,MODEL,...]
      0f3c9d1e...             phone-17    cnn,mlp
      8a71b2c4...             phone-18                     # no models: every model

  The caller's device id is the one its token names; the models it may use are those
  listed (every model when none, or `*`). Tokens are looked up by their SHA-256 and then
  compared in constant time. A file holds either one bare token or per-device lines.
- Mutual TLS (`--tls-client-ca`): clients must present a certificate signed by that CA,
  and the device id is the certificate's subject common name (CN). With a token file as
  well, the token must be valid too, and a per-device token must name the same device.

A device id is at most MAX_DEVICE_ID printable characters without whitespace. A call that
names another device than its credential's gets PERMISSION_DENIED, as does a call to a
model its token may not use (PERMISSION_DENIED, not NOT_FOUND: the caller is told it is
not allowed, and the model list it sees holds only what it may use).

Also here: `RateLimitedLog`, so that a flood of bad requests logs one line per kind and
interval, with the count of those left out.
"""
import dataclasses
import hashlib
import hmac
import ipaddress
import threading
import time

from ..errors import EdgeflowError, InvalidInputError

MAX_DEVICE_ID = 128


class Refused(EdgeflowError):
    """A call refused with the gRPC status named `status` (UNAUTHENTICATED,
    PERMISSION_DENIED); `code` is that grpc.StatusCode (grpc is imported only then, so
    that the pure state modules importing this one stay free of it)."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status

    @property
    def code(self):
        import grpc
        return grpc.StatusCode[self.status]


@dataclasses.dataclass(frozen=True)
class Identity:
    """A caller: `device` is its device id (None for a shared or anonymous identity, whose
    calls name their own), `models` the model ids it may use (None: every one), `how` the
    credential it was taken from."""
    device: str = None
    models: frozenset = None
    how: str = "anonymous"

    def may_use(self, model_id):
        return self.models is None or model_id in self.models

    def check_model(self, model_id):
        if not self.may_use(model_id):
            raise Refused("PERMISSION_DENIED",
                          f"device {self.device!r} may not use model {model_id!r}; its token allows "
                          f"{sorted(self.models)}")

    def device_for(self, claimed, required=True):
        """The device id a call acts as: the credential's (`claimed` must be empty or the
        same, else PERMISSION_DENIED), or for a shared identity the one it claims
        (checked: InvalidInputError unless a valid id, or empty when not `required`)."""
        if self.device is not None:
            if claimed and claimed != self.device:
                raise Refused("PERMISSION_DENIED",
                              f"this credential is device {self.device!r}; a call may not act as device "
                              f"{claimed[:MAX_DEVICE_ID]!r}")
            return self.device
        check_device_id(claimed, required)
        return claimed


ANONYMOUS = Identity()


def check_device_id(device_id, required=True):
    """InvalidInputError unless `device_id` is a device id (or empty, when not `required`)."""
    if not device_id:
        if required:
            raise InvalidInputError("expected a device id (a non-empty string naming the device)")
        return
    if len(device_id) > MAX_DEVICE_ID or not device_id.isprintable() or any(c.isspace() for c in device_id):
        raise InvalidInputError(f"expected a device id of at most {MAX_DEVICE_ID} printable characters "
                                f"without spaces, got {device_id[:40]!r}"
                                + (f"... ({len(device_id)} characters)" if len(device_id) > 40 else ""))


def _digest(token):
    return hashlib.sha256(token.encode() if isinstance(token, str) else token).digest()


class Tokens:
    """The bearer tokens a server accepts: one shared token, or per-device ones
    ({token: Identity}). `Tokens.parse(text)` reads a token file (see the module doc)."""

    def __init__(self, shared=None, devices=None):
        if (shared is None) == (devices is None):
            raise EdgeflowError("Tokens: give one shared token or {token: Identity}")
        if shared is not None and not _sendable(shared):
            raise EdgeflowError("the token must be printable ASCII without spaces")
        self.shared = shared
        self._by_digest = {}  # sha256(token) -> (token bytes, Identity)
        if shared is not None:
            self._by_digest[_digest(shared)] = (shared.encode(), Identity(how="shared token"))
        for token, identity in (devices or {}).items():
            self._by_digest[_digest(token)] = (token.encode(), identity)
        if not self._by_digest:
            raise EdgeflowError("the token file holds no token")

    @property
    def per_device(self):
        return self.shared is None

    def __len__(self):
        return len(self._by_digest)

    @classmethod
    def parse(cls, text, where="the token file"):
        lines = []
        for number, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            fields = fields[:next((i for i, f in enumerate(fields) if f.startswith("#")), len(fields))]
            if fields:
                lines.append((number, fields))
        if not lines:
            raise EdgeflowError(f"{where} is empty")
        if len(lines) == 1 and len(lines[0][1]) == 1:
            return cls(shared=lines[0][1][0])
        devices = {}
        for number, fields in lines:
            where_line = f"{where}, line {number}"
            if not 2 <= len(fields) <= 3:
                raise EdgeflowError(f"{where_line}: expected 'TOKEN DEVICE_ID [MODEL,...]' (a file holds one "
                                    f"bare token or per-device lines), got {len(fields)} fields")
            token, device = fields[0], fields[1]
            if not _sendable(token):
                raise EdgeflowError(f"{where_line}: the token must be printable ASCII")
            try:
                check_device_id(device)
            except InvalidInputError as e:
                raise EdgeflowError(f"{where_line}: {e}") from None
            models = None
            if len(fields) == 3 and fields[2] != "*":
                models = frozenset(m for m in fields[2].split(",") if m)
            if token in devices:
                raise EdgeflowError(f"{where_line}: this token is given twice")
            devices[token] = Identity(device, models, "token")
        return cls(devices=devices)

    def identify(self, got):
        """The Identity of the 'authorization' metadata value `got`, or Refused
        (UNAUTHENTICATED)."""
        if got is None:
            raise Refused("UNAUTHENTICATED", "expected the metadata 'authorization: Bearer <token>'")
        got = got.encode() if isinstance(got, str) else bytes(got)
        found = None
        if got.startswith(b"Bearer "):
            found = self._by_digest.get(_digest(got[7:]))
        # Compared in constant time as well (a lookup by digest leaks nothing of the token).
        if found is None or not hmac.compare_digest(found[0], got[7:]):
            raise Refused("UNAUTHENTICATED", "wrong token in 'authorization: Bearer <token>'")
        return found[1]


def _sendable(token):
    return bool(token) and token.isascii() and token.isprintable() and " " not in token


class Authenticator:
    """Identifies each call from its credentials: `tokens` (a Tokens, or None: no token
    needed) and, with `client_certificates`, the client certificate's CN."""

    def __init__(self, tokens=None, client_certificates=False):
        self.tokens, self.client_certificates = tokens, client_certificates

    def check_token(self, metadata):
        """The token's Identity (ANONYMOUS without tokens); Refused UNAUTHENTICATED."""
        if self.tokens is None:
            return ANONYMOUS
        got = next((v for k, v in metadata or () if k == "authorization"), None)
        return self.tokens.identify(got)

    def identify(self, context):
        """The Identity of the call whose grpc.ServicerContext is `context`."""
        identity = self.check_token(context.invocation_metadata())
        if not self.client_certificates:
            return identity
        names = context.auth_context().get("x509_common_name") or ()
        common_name = names[0].decode("utf-8", "replace") if names else ""
        try:
            check_device_id(common_name)
        except InvalidInputError as e:
            raise Refused("UNAUTHENTICATED", f"the client certificate's common name (CN) "
                                                           f"is not a device id: {e}") from None
        if identity.device is not None and identity.device != common_name:
            raise Refused("PERMISSION_DENIED",
                          f"the token is device {identity.device!r}'s, the client certificate "
                          f"{common_name!r}'s")
        return Identity(common_name, identity.models, "certificate")


def is_loopback(host):
    """True if `host` (a listening address) is reachable only from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class RateLimitedLog:
    """Logs at most one line per kind per `interval_s` seconds; the next line of a kind
    says how many like it were left out since."""

    def __init__(self, logger, interval_s=10.0):
        self.logger, self.interval_s = logger, interval_s
        self._lock = threading.Lock()
        self._kinds = {}  # kind -> [when last logged, left out since]

    def log(self, kind, level, message, *args, exc_info=None):
        """Log `message % args` unless a line of `kind` was logged in the last interval;
        True if it was logged."""
        now = time.monotonic()
        with self._lock:
            state = self._kinds.get(kind)
            if state is not None and now - state[0] < self.interval_s:
                state[1] += 1
                return False
            left_out = state[1] if state is not None else 0
            self._kinds[kind] = [now, 0]
            if len(self._kinds) > 4096:  # kinds are few; never let them grow without bound
                self._kinds = {kind: self._kinds[kind]}
        if left_out:
            message += f" (and {left_out} more like it in the last {self.interval_s:g} s, not logged)"
        self.logger.log(level, message, *args, exc_info=exc_info)
        return True
