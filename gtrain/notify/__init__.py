"""Notifications (docs/notify.md), experiment tracking options and the energy block of the spec.

Kept empty: the spec imports :mod:`gtrain.spec.notify`, and `gtrain --help` / `status` must not pay for
HTTP, SMTP or subprocess imports. The senders are in :mod:`gtrain.notify.dispatch`."""
