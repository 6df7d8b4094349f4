"""Workers DraftGate serves to other machines: the gRPC target worker and the HTTP draft worker.

- ``target_server``: ``draftgate serve-target``, the gRPC edge of ``engine.session_host``
  (sessions, KV, batched exact verification) and ``engine.scoring`` (the stateless Score call);
- ``draft_worker``: ``draftgate serve-draft``, any ``Drafter`` behind HTTP (its client is
  ``drafters.http.HttpDrafter``).

Import the modules by full path; this package imports nothing on its own.
"""
