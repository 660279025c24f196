package tiered

import "time"

// SetClock makes s read now for its outage log (tests advance it past
// store.OutageQuiet instead of sleeping).
func SetClock(s *Store, now func() time.Time) { s.health.now = now }
