package redisstore

// WaitWarm waits until s has finished its warm-up (connect, SCRIPT LOAD).
func WaitWarm(s *Store) { <-s.warmed }
