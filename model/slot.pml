/*
 * The counter-slot protocol of package shm (shm/table.go: Counters.Update,
 * scan, claim, apply, lockWord, Region.Reap/releaseStale) with bucket's fixed
 * window (bucket/algorithm.go: fresh, window3, takeWindow), as a Promela model
 * for spin.  model/README.md maps it to the Go code;
 * model/check.sh runs the configurations that must hold or must fail.
 * The code as built is -DPUBLISH1 -DTIMEFIX=2, plus -DREREAD for a limiter
 * with a clock (bucket.Limiter.SetClock); the default (no knobs) is the
 * earlier protocol, kept for its counterexamples (model/README.md).
 *
 * Processes
 *   worker(w, me)  two workers, w = 0, 1, owner id me.  Each answers OPS
 *                  requests; a request picks a key K in 1..NK, reads the clock
 *                  once (the `now` that bucket.Limiter.AllowKey passes to
 *                  Counters.Update) and runs Update(K): scan, insert lock,
 *                  claim, apply.
 *   clock          advances the window once (win 0 -> 1) at any moment, which
 *                  makes the slots last written in window 0 reclaimable.
 *   supervisor     (CRASH) waits for the dead worker, bumps its incarnation
 *                  (retire) and sweeps the table (releaseStale): every BUSY
 *                  slot and insert lock of a stale owner is released by one
 *                  CAS.  Then asserts P4.
 *   init           starts everything; once every worker has finished (or
 *                  died and been swept) asserts P5.
 *
 * Shared variables (arrays: one element per slot)
 *   ph, gen, pay   the state word: phase (EMPTY/BUSY/LIVE/TOMB), generation
 *                  (mod GMOD), payload.  Always loaded and CASed as ONE word,
 *                  inside one atomic{}.  LIVE payload = window*4 + count
 *                  (bucket: window index << 20 | count); 0 = a fresh key.
 *                  BUSY payload = the claimer's owner id (NOT the key).
 *   key            the key words (keyA, keyB, meta): plain atomic stores,
 *                  separate from the state word; 0 = never written.
 *   il             the insert lock word (ilock), used on a key's HOME slot:
 *                  owner id, 0 = free.
 *   inc            the header's incarnation table (workerEntry.incarnation).
 *   mark           the reclaim watermark (header word hReclaimed), a window.
 *   win            the region clock (Region.Now), as a window index.
 *   owner id       OWN(w, inc) = w*8 + inc (Go: w<<32 | inc); inc starts at
 *                  1, so an owner id is never 0.
 *
 * Properties (assertions)
 *   P1  a successful update CAS lands on a slot whose key is K.
 *   P2  per (key, window) never more than L requests allowed (ghost allowed[]).
 *   P3  a key is never LIVE in two slots (checked at each publish of LIVE,
 *       the only step that makes a slot LIVE with a key).
 *   P4  when the supervisor's sweep ends, no BUSY slot and no insert lock of
 *       the dead incarnation is left.
 *   P5  when all is over, no slot is BUSY and no insert lock is held.
 *   And pan's own: no invalid end state (a worker blocked for ever, e.g.
 *   waiting on a lock nobody releases).  With LIVENESS: no non-progress
 *   cycle (every cycle answers a request), checked with pan -l.
 *
 * Knobs (spin -D...)
 *   N, NK        slots, keys (keys 1..NK, home(K) = K mod N).  P = probe
 *                length (default N).  OPS = requests per worker (default 2).
 *                L = the limit per window (default 2).
 *   CRASH        worker 0 may die (SIGKILL), once, at one of the four crash
 *                points C1..C4 (shm's testHook stages).  Worker 1 crashing is
 *                the same up to renaming the workers.
 *   LOCKTIMEOUT  a waiter on a live lock holder may give up (ErrLockTimeout
 *                -> on_full).  Off by default: the model then also shows that
 *                nobody needs the timeout to make progress.
 *   LIVENESS     marks "a request was answered" as progress, for pan -l.
 *   TIMEFIX      which `now` a decision runs at:
 *                0  always the caller's `now` (before the watermark existed);
 *                1  the earlier protocol (the default): a key this call
 *                   installed runs at max(now, watermark); a reclaim raises
 *                   the watermark to its `now` before the BUSY CAS;
 *                2  as built: like 1, and so does ANY decision on payload 0
 *                   (a key installed by another process and not yet applied).
 *   REREAD       as built for a limiter given a clock (bucket.Limiter.SetClock,
 *                which every limiter of package core has): op reads the clock
 *                again once the key's state is loaded, and every decision,
 *                the claim's first one included, runs no earlier than that
 *                reading.  Scans, reclaims and the watermark keep the
 *                request's `now`.
 *   PUBLISH1     fix: claim publishes LIVE(gen, op(0, max(now, watermark)))
 *                instead of LIVE(gen, 0) followed by apply; the request is
 *                answered by the publish.
 *   QUOTA        accounts (shm/accounts.go): key K is charged to account
 *                ACC(K) = K mod 2, at most M (default 1) slots each.  A claim
 *                moves its BUSY slot's charge (uncharge the old account,
 *                charge the new one, each under the account's lock, a crash
 *                point after each half); the pre-check refuses a key of an
 *                account at M unless its candidate is a fresh slot of its
 *                own; releasers of a dead owner's slot clear its charge
 *                under the lock first; a lock taken from a dead holder
 *                recounts the account.  Adds P6 (held <= M), P7 (at the end
 *                every count equals the LIVE slots charged to it, nothing
 *                else is charged, no account locked), P8 (a LIVE slot's
 *                charge changes only under its owner).
 *   EVICT        (with QUOTA) each worker may once act as a sweep on a slot:
 *                a charged LIVE slot as fresh as a new key is freed
 *                (watermark, LIVE -> BUSY, uncharge, BUSY -> TOMB) without
 *                the insert lock.
 *   Broken variants, each must yield a counterexample:
 *   KEYFIRST     the scan reads the key word before the state word.
 *   NOLOCK       no insert lock: step 4 is skipped, a claim follows the scan.
 *   GMOD=1       no generation: a claim leaves the generation unchanged.
 *   NEWINDOW     fresh / new window compare the stored window with != now
 *                (a plausible reading of "its window is not the current
 *                one") instead of bucket's signed distance (< now).
 *   NORECOUNT    (QUOTA) a lock taken from a dead holder is not recounted.
 *   NOQCHECK     (QUOTA) the cap is checked by the unlocked pre-check only.
 *   NOSTATECHECK (QUOTA) a releaser clears a charge without checking that
 *                the slot is still the BUSY slot it saw.
 */

#ifndef N
#define N 2
#endif
#ifndef NK
#define NK 2
#endif
#ifndef P
#define P N
#endif
#ifndef OPS
#define OPS 2
#endif
#ifndef GMOD
#define GMOD 8                /* generations mod 8: more than the claims a run can make */
#endif
#ifndef L
#define L 2                   /* the rule's limit per window (1..3) */
#endif
#ifndef TIMEFIX
#define TIMEFIX 1
#endif
#define NW 2                  /* workers */

#define EMPTY 0
#define BUSY  1
#define LIVE  2
#define TOMB  3
#define NONE  255

#define home(K)   ((K) % N)
#define winOf(p)  ((p) / 4)
#define cntOf(p)  ((p) % 4)
#define OWN(w, n) ((w) * 8 + (n))
#define OW(o)     ((o) / 8)
#define OI(o)     ((o) % 8)
#define STALE(o)  (inc[OW(o)] != OI(o))   /* Region.stale: one read of inc[w] */

/* bucket.fresh: a slot whose payload is equivalent, at `now`, to a key never
   seen: payload 0, a count of 0, or a window that is over. */
#ifdef NEWINDOW
#define OVERAT(p, x) (winOf(p) != (x))
#else
#define OVERAT(p, x) (winOf(p) < (x))
#endif
#define OVER(p)   OVERAT(p, now)
#define FRESH(p)  ((p) == 0 || cntOf(p) == 0 || OVER(p))

/* The time a decision is taken at, into t (a window), from the request's
   `now`: at least the watermark where TIMEFIX says so (PAY0: the payload
   decided on is 0), and with REREAD at least the clock read after the
   state (bucket.Limiter with SetClock: op reads its clock again).  mark
   and win are read in one step: mark is only ever raised to some `now`,
   which is at most win, and both only grow, so max(now, mark, win) is the
   same whether mark is read before win or with it. */
#ifdef REREAD
#define REREADT   if :: win > t -> t = win :: else fi
#else
#define REREADT   skip
#endif

#ifdef QUOTA
#define CAPPED (cand != NONE && held[ACC(K)] >= M && \
  !(ph[cand] == LIVE && chg[cand] == ACC(K) + 1 && FRESH(pay[cand])))
#else
#define CAPPED 0
#endif

/* ---- shared state ---- */
byte ph[N]; byte gen[N]; byte pay[N];   /* state word */
byte key[N];                            /* key words  */
byte il[N];                             /* insert lock (ilock) of home slot i */
byte win = 0;                           /* region clock: current window */
byte inc[NW];                           /* incarnation table */
byte mark = 0;                          /* reclaim watermark (header word hReclaimed), as a window */

#ifdef QUOTA
/* Accounts (shm/accounts.go): keys of account ACC(K) hold at most M slots.
   chg[i] is slot.acct (0: none, a+1: account a); held[a] and alk[a] are the
   account's count and lock (owner id; SWEEPER for the supervisor; 0 free). */
#ifndef M
#define M 1
#endif
#define NA 2
#define ACC(K)      ((K) % NA)
#define SWEEPER     255
byte chg[N];
byte held[NA];
byte alk[NA];
/* A lock taken from a dead holder first recounts the account: only lock
   holders change held[a] or a charge to or from a+1, so the count of the
   charges is exact (Go walks the table; the model counts in the step that
   takes the lock, the walk being invisible to others but for held[a],
   which only the pre-check reads, and only as advice). */
#ifndef NORECOUNT
#define RECOUNT(a) \
  held[a] = 0; ri = 0; \
  do :: ri < N -> if :: chg[ri] == (a) + 1 -> held[a]++ :: else fi; ri++ :: else -> break od; ri = 0
#else
#define RECOUNT(a) skip          /* WRONG: a dead holder's half-done change stays */
#endif
#define TAKEABLE(a) (alk[a] == 0 || (alk[a] != SWEEPER && STALE(alk[a])))
/* accounts.lock: a load and a CAS (0 -> who, or dead holder -> who), one
   step as for the insert lock; use inside atomic{} guarded by TAKEABLE. */
#define TAKE(a, who) \
  if :: alk[a] != 0 -> RECOUNT(a) :: else fi; alk[a] = who
#define UNLOCKA(a, who) if :: alk[a] == who -> alk[a] = 0 :: else fi
/* a releaser clears a charge only while the slot is still the BUSY slot
   it saw (state word unchanged) */
#ifndef NOSTATECHECK
#define SAME(i, g, o) (ph[i] == BUSY && gen[i] == (g) && pay[i] == (o))
#else
#define SAME(i, g, o) 1          /* WRONG: the charge word alone */
#endif
#endif

/* ---- bookkeeping and ghosts (not part of the protocol) ---- */
bit  dead[NW];                          /* worker died (supervisor's waitpid) */
byte crashes = 0;                       /* at most one crash in a run */
byte done = 0;                          /* workers that finished all requests */
bit  swept = 0;                         /* supervisor's sweep has ended */
byte allowed[(NK + 1) * 2];             /* ghost: allows per (key, window) */

/* CAS of the whole state word of slot i: (oph,og,op) -> (nph,ng,np).
   Use inside atomic{}. */
#define CAS(i, oph, og, op, nph, ng, np, ok) \
  if \
  :: ph[i] == oph && gen[i] == og && pay[i] == op -> \
       ph[i] = nph; gen[i] = ng; pay[i] = np; ok = 1 \
  :: else -> ok = 0 \
  fi

/* A crash point (SIGKILL): the worker may die right after the step it ends,
   at most once per run.  Use as the last thing inside an atomic{}. */
#ifdef CRASH
#define CRASHPOINT \
  if \
  :: skip \
  :: w == 0 && crashes == 0 -> crashes++; dead[w] = 1; goto died \
  fi
#else
#define CRASHPOINT skip
#endif

/* Forget the scan's working variables (keeps the state space small) and
   scan again from home(K). */
#define RESCAN \
  cand = NONE; cfree = 0; j = 0; i = 0; k = 0; o = 0; cph = 0; cg = 0; cp = 0; np = 0; ok = 0; sst = 0; lst = 0; qa = 0; qr = 0; \
  goto scan

/* A LIVE slot whose key word read k: K found, or another key, which is a
   candidate for reclaim if its payload is fresh and no candidate (free or
   fresh) was seen before it.  The candidate of a scan is the first EMPTY or
   TOMB slot (cfree), and only when there is none the first fresh LIVE one. */
#define LIVEKEY \
  if \
  :: k == K -> k = 0; sst = 0; cand = NONE; cfree = 0; \
     if :: locked -> goto found :: else -> goto decide fi \
  :: else -> \
     if :: cand == NONE && FRESH(cp) -> cand = i :: else fi; \
     j++; k = 0; sst = 0; cph = 0; cg = 0; cp = 0 \
  fi

/* The request is answered: forget everything but op. */
#define FINISH \
  op++; K = 0; h = 0; now = 0; \
  cand = NONE; cfree = 0; j = 0; i = 0; k = 0; o = 0; cph = 0; cg = 0; cp = 0; np = 0; ok = 0; sst = 0; lst = 0; qa = 0; qr = 0; \
  goto REQUEST

/*
 * A worker.  Every atomic{} below is ONE access to a shared word (a load, a
 * store or a CAS) plus local computation, so the interleavings are those of
 * the Go code; the only exceptions are the blocking wait for a lock (a poll
 * loop in Go) and ghost updates.
 */
proctype worker(byte w; byte me) {     /* me: owner id (Region.Join) */
  byte op = 0;             /* requests answered */
  byte K, h, now;          /* the request: key, home(K), its clock reading */
  byte t;                  /* a decision's time (a window), within one step */
  byte i, j, cand = NONE;  /* slot, probe count, candidate */
  byte k, o;               /* key word read; lock owner read */
  byte cph, cg, cp, np;    /* snapshot of a state word (phase, gen, payload); next payload */
  byte sst, lst;           /* sub-steps of the scan and of the lock loop */
  bit ok, locked;          /* CAS result; insert lock held */
  bit cfree;               /* cand is a free (EMPTY or TOMB) slot */
  byte qa, ri;             /* QUOTA: a charge word read (account + 1); recount index */
  bit qr, ev;              /* QUOTA: the charge was refused (ErrQuota); EVICT: evicted once */

#ifdef LIVENESS
#define REQUEST progress_request
progress_request:                           /* progress: a request was answered */
#else
#define REQUEST request
request:
#endif
  if
  :: atomic { op < OPS ->
       K = 1; do :: K < NK -> K++ :: break od; h = home(K);
       now = win;                           /* the clock, read once per request */
       printf("W%d request K=%d now=%d\n", w, K, now) }
#ifdef EVICT
  :: atomic { op < OPS && !ev ->              /* a sweep meets slot i (Counters.sweep) */
       ev = 1; i = 0; do :: i < N - 1 -> i++ :: break od;
       now = win; goto evict }
#endif
  :: atomic { op == OPS -> done++; goto end_w }
  fi;

  /* ---- scan: at most P slots from home(K); each slot: state, then key ---- */
scan:
  do
#ifndef KEYFIRST
  :: atomic { sst == 0 && j < P ->
       i = (h + j) % N; cph = ph[i]; cg = gen[i]; cp = pay[i];     /* load state */
#else
  :: atomic { sst == 0 && j < P -> i = (h + j) % N; k = key[i]; sst = 4 }   /* WRONG: key first */
  :: atomic { sst == 4 ->
       cph = ph[i]; cg = gen[i]; cp = pay[i];
#endif
       if
       :: cph == EMPTY ->                   /* end of chain (slots never become EMPTY again) */
          if :: !cfree -> cand = i; cfree = 1 :: else fi; j = P; sst = 0; cph = 0; cg = 0; cp = 0
       :: cph == TOMB ->                    /* a free slot beats a fresh LIVE one */
          if :: !cfree -> cand = i; cfree = 1 :: else fi; j++; sst = 0; cph = 0; cg = 0; cp = 0
       :: cph == BUSY -> sst = 1            /* payload = owner id, not the key */
#ifndef KEYFIRST
       :: cph == LIVE -> sst = 2            /* go and read the key */
#else
       :: cph == LIVE -> LIVEKEY            /* compare the key read BEFORE the state */
#endif
       fi }
  /* RELEASE: a release of a dead owner's BUSY slot or lock is a load, a load
     of inc[w] and a CAS; the model does the CAS in the same step as the inc
     load (and the lock's in the same step as its load).  That loses nothing:
     a dead owner's value can only change by another such release (to the
     same result), and inc[w] only grows. */
#ifndef QUOTA
  :: atomic { sst == 1 ->                   /* BUSY: Region.stale(owner) loads inc[w] */
       if
       :: STALE(cp) ->                      /* releaseBusy: CAS BUSY -> TOMB, same gen (see RELEASE) */
          CAS(i, BUSY, cg, cp, TOMB, cg, 0, ok);
          if :: ok && !cfree -> cand = i; cfree = 1 :: else fi   /* a tombstone now: free */
       :: else                              /* live owner: skip the slot */
       fi;
       j++; sst = 0; cph = 0; cg = 0; cp = 0; ok = 0 }
#else
  :: atomic { sst == 1 ->                   /* BUSY: stale owner? then load the charge word */
       if
       :: STALE(cp) -> qa = chg[i]; sst = 5
       :: else -> j++; sst = 0; cph = 0; cg = 0; cp = 0   /* live owner: skip the slot */
       fi }
  :: atomic { sst == 5 ->                   /* releaseBusy of a dead owner's slot */
       if
       :: qa == 0 -> sst = 10               /* uncharged: release it */
       :: qa != 0 && TAKEABLE(qa - 1) -> TAKE(qa - 1, me); sst = 6    /* try-lock, no wait */
       :: else -> qa = 0; j++; sst = 0; cph = 0; cg = 0; cp = 0       /* live holder: leave it */
       fi }
  :: atomic { sst == 6 ->                   /* uncharge: only if the slot is as seen */
       if
       :: SAME(i, cg, cp) && chg[i] == qa -> chg[i] = 0; sst = 7; CRASHPOINT   /* "uncharged" */
       :: SAME(i, cg, cp) && chg[i] != qa -> sst = 8
       :: else -> sst = 9                   /* released by another meanwhile (errLost) */
       fi }
  :: atomic { sst == 7 -> held[qa - 1]--; sst = 8 }
  :: atomic { sst == 8 -> UNLOCKA(qa - 1, me); qa = 0; sst = 10 }
  :: atomic { sst == 9 -> UNLOCKA(qa - 1, me); qa = 0; j++; sst = 0; cph = 0; cg = 0; cp = 0 }
  :: atomic { sst == 10 ->
       CAS(i, BUSY, cg, cp, TOMB, cg, 0, ok);
       if :: ok && !cfree -> cand = i; cfree = 1 :: else fi;   /* a tombstone now: free */
       j++; sst = 0; cph = 0; cg = 0; cp = 0; ok = 0 }
#endif
#ifndef KEYFIRST
  :: atomic { sst == 2 ->
       k = key[i];                          /* load key (after the state) */
       LIVEKEY }
#endif
  :: atomic { sst == 0 && j >= P ->         /* scanned, K not found */
       if
       :: cand == NONE ->                   /* step 3: ErrFull, the rule's on_full answers */
          printf("W%d full K=%d\n", w, K);
          if :: locked -> if :: il[h] == me -> il[h] = 0 :: else fi; locked = 0 :: else fi;
          FINISH
#ifdef QUOTA
       /* withinQuota: at its maximum, the account takes only a fresh slot
          of its own (advice: the charge under the account's lock decides) */
       :: CAPPED ->
          printf("W%d capped K=%d\n", w, K);
          if :: locked -> if :: il[h] == me -> il[h] = 0 :: else fi; locked = 0 :: else fi;
          FINISH
#endif
#ifndef NOLOCK
       :: cand != NONE && !CAPPED && !locked -> goto lock
#endif
       :: else ->                           /* step 5: re-load the candidate's state */
          cph = ph[cand]; cg = gen[cand]; cp = pay[cand]; cfree = 0;
          if
          :: cph == EMPTY || cph == TOMB || (cph == LIVE && FRESH(cp)) -> goto claim
          :: else -> RESCAN
          fi
       fi }
  od;

  /* ---- step 4: the insert lock of home(K), then rescan under it ---- */
lock:
  do
  :: atomic { lst == 0 && il[h] == 0 ->     /* load 0, CAS 0 -> me */
       il[h] = me; locked = 1;
       CRASHPOINT;                          /* C1 "locked" */
       RESCAN }
  :: atomic { lst == 0 && il[h] != 0 ->     /* load: held by o */
       o = il[h];
       if
       :: STALE(o) -> il[h] = 0; o = 0      /* dead holder: CAS o -> 0 (see RELEASE) */
       :: else -> lst = 3                   /* live holder */
       fi }
  :: atomic { lst == 3 && (il[h] != o || STALE(o)) -> lst = 0; o = 0 }   /* live holder: wait */
#ifdef LOCKTIMEOUT
  :: atomic { lst == 3 -> printf("W%d lock timeout K=%d\n", w, K); FINISH }  /* ErrLockTimeout */
#endif
  od;

  /* ---- step 5: claim cand (snapshot cph, cg, cp): BUSY, key, LIVE ---- */
claim:
#if TIMEFIX >= 1
  /* raiseReclaimMark(now): before the old key's state is gone (atomic max) */
  atomic { if :: cph == LIVE && mark < now -> mark = now :: else fi }
#endif
  atomic {
    CAS(cand, cph, cg, cp, BUSY, (cg + 1) % GMOD, me, ok);
    if
    :: ok -> printf("W%d claim slot %d (ph %d pay %d): BUSY gen %d\n", w, cand, cph, cp, (cg + 1) % GMOD);
             cg = (cg + 1) % GMOD; cph = 0; cp = 0; ok = 0
    :: else -> RESCAN
    fi;
    CRASHPOINT }                            /* C2 "busy" */
#ifdef QUOTA
  /* recharge: move the slot's charge to K's account while it is BUSY(me) */
  atomic { qa = chg[cand] }
  if
  :: qa == ACC(K) + 1 -> qa = 0             /* its own account's: nothing to move */
  :: else ->
     if
     :: qa != 0 ->                          /* uncharge the old account */
        atomic { TAKEABLE(qa - 1) -> TAKE(qa - 1, me) }
        atomic { assert(ph[cand] == BUSY && gen[cand] == cg && pay[cand] == me && chg[cand] == qa);
                 chg[cand] = 0; CRASHPOINT }                   /* "uncharged" */
        atomic { held[qa - 1]-- }
        atomic { UNLOCKA(qa - 1, me); qa = 0 }
     :: else
     fi;
     atomic { TAKEABLE(ACC(K)) -> TAKE(ACC(K), me) }
     atomic {
       assert(ph[cand] == BUSY && gen[cand] == cg && pay[cand] == me);
       if
#ifndef NOQCHECK
       :: held[ACC(K)] >= M -> qr = 1       /* ErrQuota */
#else
       :: false -> skip                     /* WRONG: only the unlocked pre-check */
#endif
       :: else -> held[ACC(K)]++; assert(held[ACC(K)] <= M); CRASHPOINT   /* "charged"; P6 */
       fi }
     if :: !qr -> atomic { chg[cand] = ACC(K) + 1 } :: else fi;
     atomic { UNLOCKA(ACC(K), me) }
     if
     :: qr ->                               /* leave the slot free, answer on_full */
        atomic { CAS(cand, BUSY, cg, me, TOMB, cg, 0, ok); assert(ok) }
        atomic { if :: il[h] == me -> il[h] = 0 :: else fi; locked = 0; FINISH }
     :: else
     fi
  fi;
#endif
  atomic {
    key[cand] = K;                          /* keyA, keyB, meta */
    CRASHPOINT }                            /* C3 "keyed" */
#ifdef PUBLISH1
  atomic {                                  /* op(0, t): the first decision, on payload 0 */
    t = now;
#if TIMEFIX >= 1
    if :: mark > t -> t = mark :: else fi;  /* t = max(now, reclaimMark()) */
#endif
    REREADT;
    np = t * 4 + 1; t = 0 }                 /* L >= 1: a new key's first request passes */
#endif
  atomic {
#ifdef PUBLISH1
    CAS(cand, BUSY, cg, me, LIVE, cg, np, ok);
#else
    CAS(cand, BUSY, cg, me, LIVE, cg, 0, ok);
#endif
    assert(ok);                             /* only a sweep that judged us dead moves our BUSY slot */
    printf("W%d publish K=%d in slot %d gen %d payload %d\n", w, K, cand, cg, pay[cand]);
    j = 0;                                  /* P3: K is LIVE in no other slot */
    do
    :: j < N -> assert(j == cand || ph[j] != LIVE || key[j] != K); j++
    :: else -> break
    od;
#ifdef PUBLISH1
    allowed[K * 2 + winOf(np)]++;
    assert(allowed[K * 2 + winOf(np)] <= L);            /* P2 */
#endif
    i = cand; cand = NONE; cfree = 0; cp = 0; j = 0; ok = 0; np = 0;
    CRASHPOINT }                            /* C4 "published" */
#ifdef PUBLISH1
  atomic { if :: il[h] == me -> il[h] = 0 :: else fi; locked = 0; FINISH }   /* unlock; answered */
#elif TIMEFIX == 1
  atomic { if :: il[h] == me -> il[h] = 0 :: else fi; locked = 0 }   /* unlock: CAS me -> 0 */
  /* earlier protocol: apply(..., max(now, reclaimMark()), op) after a claim only */
  atomic { if :: mark > now -> now = mark :: else fi; goto decide }
#else
  atomic { if :: il[h] == me -> il[h] = 0 :: else fi; locked = 0; goto decide }   /* unlock */
#endif

  /* ---- found: release the lock, then apply ---- */
found:
  atomic { if :: il[h] == me -> il[h] = 0 :: else fi; locked = 0 }   /* unlock: CAS me -> 0 */

  /* ---- apply: bucket.Policy.Take (fixed window) on snapshot (i, cg, cp) ---- */
decide:
  atomic {
    /* t: the decision's time; `now` stays the request's, for a rescan
       (apply's Update again runs with the caller's now) */
    t = now;
#if TIMEFIX == 2
    /* the fix: ANY decision on payload 0 (a key installed, maybe by another
       process, and not yet applied) runs at max(now, reclaimMark()) */
    if :: cp == 0 && mark > t -> t = mark :: else fi;
#endif
    REREADT;
    if
    :: cp == 0 || OVERAT(cp, t) -> np = t * 4 + 1       /* new window: count 1 */
    :: else ->                                          /* the stored window (never an older one) */
       if
       :: cntOf(cp) < L -> np = cp + 1
       :: else -> printf("W%d refuse K=%d\n", w, K); t = 0; FINISH   /* a refusal writes nothing */
       fi
    fi;
    t = 0 }
  atomic {
    CAS(i, LIVE, cg, cp, LIVE, cg, np, ok);
    if
    :: ok ->
       printf("W%d allow K=%d slot %d: %d -> %d (window %d count %d)\n", w, K, i, cp, np, winOf(np), cntOf(np));
       assert(key[i] == K);                             /* P1 */
       allowed[K * 2 + winOf(np)]++;
       assert(allowed[K * 2 + winOf(np)] <= L);         /* P2 */
       FINISH
    :: else -> np = 0; ok = 0
    fi }
  atomic {                                              /* CAS failed: load the state again */
    cph = ph[i]; o = gen[i];
    if
    :: cph == LIVE && o == cg -> cp = pay[i]; cph = 0; o = 0; goto decide   /* same key, newer payload */
    :: else -> RESCAN                                   /* reclaimed: Update again */
    fi }

#ifdef EVICT
  /* ---- a sweep's step on slot i (Counters.sweep): a charged LIVE slot as
     fresh as a new key is freed, without the insert lock: the watermark
     raised, LIVE -> BUSY, the charge cleared, BUSY -> TOMB ---- */
evict:
  atomic { qa = chg[i] }                    /* the charge word first (the sweep's filter) */
  atomic { cph = ph[i]; cg = gen[i]; cp = pay[i];
           if :: qa != 0 && cph == LIVE && FRESH(cp) -> skip :: else -> FINISH fi }
  atomic { if :: mark < now -> mark = now :: else fi }
  atomic { CAS(i, LIVE, cg, cp, BUSY, (cg + 1) % GMOD, me, ok);
           if :: ok -> cg = (cg + 1) % GMOD; ok = 0 :: else -> FINISH fi;
           CRASHPOINT }
  atomic { assert(chg[i] == qa) }          /* P8: a LIVE slot's charge changes only under its owner */
  atomic { TAKEABLE(qa - 1) -> TAKE(qa - 1, me) }
  atomic { assert(ph[i] == BUSY && gen[i] == cg && pay[i] == me && chg[i] == qa); chg[i] = 0; CRASHPOINT }   /* "uncharged" */
  atomic { held[qa - 1]-- }
  atomic { UNLOCKA(qa - 1, me) }
  atomic { CAS(i, BUSY, cg, me, TOMB, cg, 0, ok); assert(ok); FINISH }
#endif

died:
  skip;
end_w:
  skip
}

/* Region.Reap(w) after waitpid: retire, then releaseStale. */
proctype supervisor() {
  byte i, old;
#ifdef QUOTA
  byte sg, so, sc, ri, a;
#endif
end_wait:
  dead[0];                                  /* waitpid (only worker 0 may crash: symmetry) */
  atomic { old = OWN(0, inc[0]); inc[0] = inc[0] + 1 }   /* retire: (0, old inc) is stale from now on */
  i = 0;
  do
  :: i < N ->                               /* releaseStale, slot by slot (see RELEASE) */
#ifndef QUOTA
     atomic { if :: ph[i] == BUSY && STALE(pay[i]) -> ph[i] = TOMB; pay[i] = 0 :: else fi }
#else
     /* releaseBusy(sweeperID): the charge cleared under the account's lock
        (waiting for a live holder), if the slot is still as seen; then
        BUSY -> TOMB.  The supervisor never crashes in this model. */
     atomic { if :: ph[i] == BUSY && STALE(pay[i]) -> sg = gen[i]; so = pay[i]; sc = chg[i]
                 :: else -> so = 0 fi }
     if
     :: so != 0 && sc != 0 ->
        atomic { TAKEABLE(sc - 1) -> TAKE(sc - 1, SWEEPER) }
        atomic { if :: SAME(i, sg, so) && chg[i] == sc -> chg[i] = 0; sc = sc + 100
                    :: SAME(i, sg, so) && chg[i] != sc -> skip
                    :: else -> so = 0     /* released by another meanwhile */
                 fi }
        if :: sc > 100 -> sc = sc - 100; atomic { held[sc - 1]-- } :: else fi;
        atomic { UNLOCKA(sc - 1, SWEEPER) }
     :: else
     fi;
     atomic { if :: so != 0 && ph[i] == BUSY && gen[i] == sg && pay[i] == so -> ph[i] = TOMB; pay[i] = 0 :: else fi;
              sg = 0; so = 0; sc = 0 }
#endif
     atomic { if :: il[i] != 0 && STALE(il[i]) -> il[i] = 0 :: else fi; i++ }
  :: else -> break
  od;
#ifdef QUOTA
  /* accounts.releaseStale: a lock of the dead incarnation is taken over,
     the account recounted, the lock freed. */
  a = 0;
  do
  :: a < NA ->
     atomic { if :: alk[a] != 0 && alk[a] != SWEEPER && STALE(alk[a]) -> RECOUNT(a); alk[a] = 0 :: else fi; a++ }
  :: else -> break
  od;
  a = 0;
#endif
  /* P4: nothing owned by the dead incarnation is left (others may have
     released some of it lazily; nobody can take anything new as it). */
  atomic {
    i = 0;
    do
    :: i < N -> assert(!(ph[i] == BUSY && pay[i] == old) && il[i] != old); i++
    :: else -> break
    od;
#ifdef QUOTA
    i = 0;
    do
    :: i < NA -> assert(alk[i] != old); i++
    :: else -> break
    od;
#endif
    swept = 1; i = 0; old = 0
  }
}

proctype clock() { win = 1; printf("clock: window 1\n") }

init {
  byte i;
  atomic {
    inc[0] = 1; inc[1] = 1;
    run worker(0, OWN(0, 1)); run worker(1, OWN(1, 1)); run clock();
#ifdef CRASH
    run supervisor();
#endif
  }
  /* P5: once every worker has finished (or died and been swept), no slot is
     BUSY and no insert lock is held.  If a worker could wait forever, pan
     reports an invalid end state here. */
  atomic {
    done + crashes == NW && (crashes == 0 || swept) ->
    i = 0;
    do
    :: i < N -> assert(ph[i] != BUSY && il[i] == 0); i++
    :: else -> break
    od;
#ifdef QUOTA
    /* P7: every count equals the LIVE slots charged to its account, no
       other slot is charged, and no account is locked. */
    i = 0;
    do
    :: i < N -> assert(chg[i] == 0 || ph[i] == LIVE); i++
    :: else -> break
    od;
    i = 0;
    do
    :: i < NA ->
       assert(alk[i] == 0);
       assert(held[i] == (chg[0] == i + 1) + (N > 1 && chg[1 % N] == i + 1) + (N > 2 && chg[2 % N] == i + 1));
       i++
    :: else -> break
    od
#endif
  }
}
