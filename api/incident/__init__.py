"""The incident page's content: what it charts and says, from the store and the alerts."""
