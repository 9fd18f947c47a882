"""Log lines that say which request they are about, as text or JSON (`edgeflow serve
--log-format`).

While the server answers a call, the call's `Request` (its id, and its model once known)
is current on the call's thread (a contextvar); `RequestFilter`, on a handler, copies it
onto every record logged meanwhile, from any module, so nothing passes ids around.
"""
import contextvars
import datetime
import json
import logging
import uuid

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_current = contextvars.ContextVar("edgeflow_request", default=None)


class Request:
    """A call being answered: `id`, the device's request id if it sent one (set it once
    read), else a short generated one; `model`, its model's id once known."""

    def __init__(self, request_id=None, model=None):
        self.id = request_id or uuid.uuid4().hex[:16]
        self.model = model


def enter(request):
    """Make `request` current on this thread; a token for `leave`."""
    return _current.set(request)


def leave(token):
    """Restore what was current before `enter` returned `token`."""
    try:
        _current.reset(token)
    except ValueError:  # a generator closed on another thread: there is nothing of it to restore
        pass


def current():
    """The Request current on this thread, or None."""
    return _current.get()


class RequestFilter(logging.Filter):
    """Adds `request_id` ("-" outside a request) and `model` (None when unknown) to each
    record (unless the call gave them in `extra`)."""

    def filter(self, record):
        request = _current.get()
        if not hasattr(record, "request_id"):
            record.request_id = request.id if request is not None else "-"
        if not hasattr(record, "model"):
            record.model = request.model if request is not None else None
        return True


class TextFormatter(logging.Formatter):
    """`TEXT_FORMAT`, plus ` [request_id]` on a line about a request."""

    def __init__(self):
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record):  # before a traceback, which format() appends
        line = super().formatMessage(record)
        request_id = getattr(record, "request_id", "-")
        return line if request_id == "-" else f"{line} [{request_id}]"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log collectors: time (UTC, ISO 8601), level, logger,
    message, request_id (null outside a request), model (when known) and exception (the
    traceback, when there is one)."""

    def format(self, record):
        request_id = getattr(record, "request_id", "-")
        line = {"time": datetime.datetime.fromtimestamp(record.created, datetime.timezone.utc)
                .isoformat(timespec="milliseconds"),
                "level": record.levelname, "logger": record.name, "message": record.getMessage(),
                "request_id": None if request_id == "-" else request_id}
        if getattr(record, "model", None):
            line["model"] = record.model
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


FORMATTERS = {"text": TextFormatter, "json": JsonFormatter}


def install(log_format="text", level=logging.INFO):
    """Log `level` and up to stderr in `log_format` ("text" or "json"), each line with its
    request; the handler, or None when the root logger has handlers already (the program
    embedding the server configured logging: its choice stands)."""
    root = logging.getLogger()
    if root.handlers:
        return None
    handler = logging.StreamHandler()
    handler.addFilter(RequestFilter())
    handler.setFormatter(FORMATTERS[log_format]())
    root.addHandler(handler)
    root.setLevel(level)
    return handler
