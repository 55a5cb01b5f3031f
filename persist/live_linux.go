package persist

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/preforkd/preforkd/bucket"
	"github.com/preforkd/preforkd/shm"
	"golang.org/x/sys/unix"
)

// OpenRegion makes the region of a supervisor that is starting, before
// any worker exists, and locks the files it persists to.
//
// It first takes the lock of o.Live and of o.Path (a file FILE.lock beside
// each): a second supervisor on either gets an error that wraps ErrInUse
// and names the path and the holder's pid. lock is nil when both are "".
//
// Without a live region (o.Live == "") the region is shm.Create(geo).
// With o.Live, if a region is left there (its supervisor died, e.g. by
// kill -9), it is re-attached: its owner and mode are checked as a dump's
// are, and its header; workers of the dead supervisor that still map it
// are killed, whatever dead processes held (BUSY slots, insert locks,
// reservations) is released, and any dump at o.Path is moved to
// PATH.superseded unread, because the live region is newer than any dump.
// A region of another size than geo asks for is migrated into a new one
// of that size (its entries re-inserted by key). A region that is refused
// is logged with the reason and replaced by a fresh one; a dump there
// (persist.path's kind of file) is an error, and left as it is. Otherwise
// a fresh region is created there.
//
// The caller keeps lock until its process ends, or until it has dumped
// the region and no longer uses it; a nil log means slog.Default().
func OpenRegion(o Options, geo shm.Options, log *slog.Logger) (r *shm.Region, lock *Lock, reattached bool, err error) {
	if o.Path == "" && o.Live == "" {
		r, err = create("", o, geo)
		return r, nil, false, err
	}
	if _, err := CheckNames(o); err != nil {
		return nil, nil, false, err
	}
	if log == nil {
		log = slog.Default()
	}
	l := &Lock{}
	for _, path := range []string{o.Live, o.Path} {
		if path == "" {
			continue
		}
		if err := l.lock(path); err != nil {
			l.Unlock()
			return nil, nil, false, err
		}
	}
	r, reattached, err = openRegion(o, geo, log)
	if err != nil {
		l.Unlock()
		return nil, nil, false, err
	}
	return r, l, reattached, nil
}

// openRegion is OpenRegion once the locks are held.
func openRegion(o Options, geo shm.Options, log *slog.Logger) (*shm.Region, bool, error) {
	if o.Live == "" {
		r, err := create("", o, geo)
		return r, false, err
	}
	log = log.With("live", o.Live)
	warnIfNotTmpfs(o.Live, log)
	// A supervisor that died inside shm.CreateFile left its temporary file.
	removePrefixed(filepath.Dir(o.Live), liveTempPrefix(o.Live))
	r, err := openLive(o.Live)
	switch {
	case err == nil:
		r, err = reattach(r, o, geo, log)
		return r, err == nil, err
	case errors.Is(err, fs.ErrNotExist):
	case errors.Is(err, fs.ErrPermission):
		return nil, false, err
	case isDump(o.Live):
		// Not a region of a run that crashed: a dump, named as the live
		// region by mistake, whose state a fresh region would destroy.
		return nil, false, liveIsDump(o.Live)
	default:
		log.Warn("persist: live region refused: creating a fresh one", "detail", err.Error())
	}
	r, err = create(o.Live, o, geo)
	return r, false, err
}

// create makes a fresh region, in a file at live or in memory, that
// records persist.key as what makes its stored responses.
func create(live string, o Options, geo shm.Options) (r *shm.Region, err error) {
	if live == "" {
		r, err = shm.Create(geo)
	} else {
		r, err = shm.CreateFile(live, geo)
	}
	if err == nil {
		r.SetResponsesKey(keyHash(o.Key))
	}
	return r, err
}

// openLive attaches the live region at path, unless it cannot be trusted
// (see untrusted): its owner and mode are read from the open file, the one
// that is then mapped.
func openLive(path string) (*shm.Region, error) {
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("persist: live region: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("persist: live region: %w", err)
	}
	if why := untrusted(fi); why != "" {
		f.Close()
		return nil, fmt.Errorf("persist: live region %s: untrusted: %s", path, why)
	}
	r, err := shm.Attach(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return r, nil
}

// orphanWait bounds the wait for the workers of a dead supervisor to die.
const orphanWait = 5 * time.Second

// reattach makes a region left by dead processes usable again.
func reattach(r *shm.Region, o Options, geo shm.Options, log *slog.Logger) (*shm.Region, error) {
	// Workers that outlived their supervisor would go on writing under
	// identities that ReapAll retires.
	if killed := r.KillOrphans(orphanWait); len(killed) > 0 {
		log.Warn("persist: killed the workers of the dead supervisor", "pids", fmt.Sprint(killed))
	}
	released := r.ReapAll()
	// Never serve negative time: a time base from another boot or time
	// namespace is replaced by the last beat plus the wall-clock downtime.
	if res := r.ResumeClock(time.Now()); res.Rebased {
		log.Warn("persist: live region clock rebased", "reason", res.Reason,
			"region_time_was", res.Before, "region_time", res.After)
	}
	st := r.Counters().Stats()
	log.Info("persist: live region re-attached", "entries", st.Live, "released", released,
		"created", r.Created().UTC().Format(time.RFC3339), "region_time", r.Now())
	// Stored responses and cache entries made under another persist.key
	// (another version of the application) are dropped, as a load drops
	// them: the counters are copied into a new region without them.
	if r.ResponsesKey() != keyHash(o.Key) {
		st := r.Responses().Stats()
		if st.Complete+st.Cached > 0 {
			nr, err := migrate(r, o.Live, geo, false)
			if err != nil {
				// Never serve them: a fresh region, the counters lost too.
				log.Warn("persist: live region replaced: its stored responses are of another persist.key and could not be dropped alone",
					"detail", err.Error())
				r.Close()
				return create(o.Live, o, geo)
			}
			log.Warn("persist: live region's stored responses dropped", "reason", ReasonKeyChanged,
				"responses", st.Complete, "cached", st.Cached, "entries", nr.Counters().Stats().Live)
			r = nr
		}
		r.SetResponsesKey(keyHash(o.Key))
	}
	// Another size, or statistics rows laid out by another build (whose
	// counts this one would misread): a new region, the state copied.
	if want, err := geo.Size(); err == nil && (want != regionSize(r) || r.Geometry().StatLayout != geo.StatLayout) {
		nr, err := migrate(r, o.Live, geo, true)
		if err != nil {
			log.Warn("persist: live region kept at its old size", "detail", err.Error())
		} else {
			log.Info("persist: live region migrated to the configured size", "slots", nr.Geometry().Counters,
				"entries", nr.Counters().Stats().Live)
			r = nr
		}
	}
	if o.Path != "" {
		if _, err := os.Stat(o.Path); err == nil {
			if err := consume(o.Path, o.Path+SuffixSuperseded); err != nil {
				r.Close()
				return nil, err
			}
			log.Info("persist: dump superseded by the live region", "path", o.Path, "moved_to", o.Path+SuffixSuperseded)
		}
	}
	return r, nil
}

// migrate re-creates the live region at path with geometry geo and copies
// old's counters into it, and with responses its stored responses, cache
// entries, tag generations and the key they were made under (keeping
// seeds and clock); what the new tables cannot hold is dropped, and so is
// the cache when the tag table's size changed. old is closed on success.
func migrate(old *shm.Region, path string, geo shm.Options, responses bool) (*shm.Region, error) {
	nr, err := shm.CreateFile(path, geo) // renamed over old's file; old's mapping stays valid
	if err != nil {
		return nil, err
	}
	s1, s2 := old.Seeds()
	if err := nr.SetSeeds(s1, s2); err != nil {
		nr.Close()
		return nil, err
	}
	now := old.Now()
	nr.SetNow(now)
	// A smaller table may not hold every entry: what does not fit is dropped.
	for e := range old.Counters().Snapshot() {
		if !bucket.Fresh(e.Meta, e.Payload, now) {
			nr.Counters().Place(e)
		}
	}
	if !responses {
		old.Close()
		return nr, nil
	}
	nr.SetResponsesKey(old.ResponsesKey())
	sameTags := old.Tags().Len() == nr.Tags().Len()
	if sameTags {
		for g := range old.Tags().Snapshot() {
			nr.Tags().Place(g)
		}
	}
	for e := range old.Responses().Snapshot(now) {
		if e.Kind == shm.KindCache && !sameTags {
			continue // its generations could not be checked
		}
		nr.Responses().Place(e, now)
	}
	old.Close()
	return nr, nil
}

// regionSize is the size of r's mapping.
func regionSize(r *shm.Region) int64 {
	n, _ := r.Geometry().Size() // a region's geometry is valid
	return n
}

// warnIfNotTmpfs warns about a live region on a disk-backed file system:
// the kernel writes it back to disk for nothing, and a region that
// survives a reboot holds a time base of another boot (re-attaching
// rebases it from its last beat, see shm.Region.ResumeClock).
func warnIfNotTmpfs(path string, log *slog.Logger) {
	var fs unix.Statfs_t
	if err := unix.Statfs(filepath.Dir(path), &fs); err == nil && fs.Type != unix.TMPFS_MAGIC {
		log.Warn("persist: persist.live is not on tmpfs (e.g. /dev/shm): a region there costs disk writes and must not survive a reboot")
	}
}
