"""Alerts and incidents: findings become alerts (pending, firing, resolved), alerts group
into incidents, silences and inhibition mute them, and delivery sends them to Alertmanager
and webhooks.  ``engine`` and ``matchers`` are computations over state, free of I/O; the
store keeps that state and ``delivery`` is the only code that talks to receivers.
"""
