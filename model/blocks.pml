/*
 * blocks.pml: the response blocks' protocol in package shm
 * (shm/blocks.go: allocBlock, freeBlock, store, freeChain, held,
 * reclaimStale; shm/responses.go: Complete, drop/retire and releaseRec
 * as Reap runs it), for one record and a pool of NB blocks.
 *
 * Two workers each run OPS operations on the record:
 *   fill: claim it (EMPTY or TOMB -> RESERVED, its kind word naming the
 *         worker's stamp), build a chain of L blocks (each taken by a CAS
 *         of its header from stamp 0 to the worker's, then its bit set,
 *         then linked; a block whose bit is clear and whose stamp is a
 *         reaped worker's is free too), name the chain in the record,
 *         RESERVED -> COMPLETE;
 *         a pool too short frees the part built (its own stamp) and
 *         releases the record; a lost record frees the whole chain;
 *   drop: COMPLETE -> BUSY (the worker's), then each block of the chain
 *         taken from the builder's stamp by a CAS (stop at another stamp),
 *         the record's chain word set to the rest, the bit cleared, the
 *         stamp cleared; then the chain word emptied and BUSY -> TOMB;
 *   release: a RESERVED or BUSY record of a reaped owner whose chain word
 *         is empty -> TOMB (the lazy release of scan and cacheScan).
 * Worker 0 may die at any moment; the supervisor then reaps it: its
 * incarnation is retired (its stamp and owner id become stale), releaseRec
 * finishes a free it died in (record taken BUSY for the supervisor, chain
 * freed from the builder's stamp or worker 0's), or empties the chain word
 * of a reservation it was completing, then reclaimStale: candidates (blocks
 * in use of a stale stamp: bit, then header read), held (blocks of a COMPLETE record's
 * chain walked with the state checked again after, and the next block of
 * a chain being freed), then each candidate not held taken by a CAS of its
 * header to the reaper's stamp and freed.
 *
 * As in slot.pml every atomic{} is one access to one shared word (load,
 * store or CAS) plus local computation. A block's header is one word
 * (next index and stamp, hd_nx[b] and st[b]); a CAS of it compares both.
 * Merges: the record's claim (BUSY, kind, chain word, RESERVED) is one
 * step (a crash in it leaves a record of the dead with an empty chain,
 * released as here); a CAS loop on a header (load, CAS, reload) is one
 * conditional step; allocBlock's scan of the bitmap (one word) and its
 * choice of a clear bit is one step, and a failed header CAS ends the
 * allocation (Go tries the other clear bits first).
 *
 * Ghosts: who[b] is who holds block b (FREE, W0, W1, SUP, REAP, or REC:
 * the chain of the record completed in generation wgen[b]).
 *   B1 "who[b]==FREE"   a block is taken only when free (never twice);
 *   B2 "who[h]==REC"    a freer takes only a block of the chain it dropped;
 *   B3 "REAPOK"         the reaper takes only a block of the dead worker's
 *                       or of a chain no COMPLETE record holds;
 *   B4 "EXACT"          at the end, with every worker done or reaped, the
 *                       blocks in use are exactly the COMPLETE record's
 *                       chain, of its stamp, and every free block has
 *                       stamp 0 or the dead worker's (no leak).
 *
 * Broken variants, each must produce a counterexample:
 *   -DNOCAS       a freer restamps a block whatever its stamp (B2)
 *   -DNOHELD      reclaimStale frees candidates a COMPLETE record holds (B3)
 *   -DNOPROGRESS  a free does not record its progress in the record (B4:
 *                 the supervisor cannot finish it)
 */

#ifndef NB
#define NB 3
#endif
#ifndef L
#define L 2
#endif
#ifndef OPS
#define OPS 2
#endif

#define NONE 7

/* stamps and owners */
#define FREE 0
#define W0   1
#define W1   2
#define SUP  3
#define REAP 4
#define REC  5

/* record phases */
#define EMPTY 0
#define BUSY  1
#define RES   2
#define COMP  3
#define TOMB  4

bit  bm[NB];        /* the bitmap */
byte st[NB];        /* header: stamp */
byte hd_nx[NB];     /* header: next */
byte who[NB];       /* ghost: holder */
byte wgen[NB];      /* ghost: generation of the record whose chain holds it */

byte rph;           /* record state: phase, generation, owner */
byte rgen;
byte rown;
byte rhead = NONE;  /* chain word: first block, count */
byte rcnt;
byte rB;            /* kind word's stamp: the chain's builder */

bool dead0;         /* worker 0's process is gone */
bool stale0;        /* worker 0's incarnation retired by Reap */
bool crash;         /* worker 0 is killed */
byte done;          /* workers done */

#define STALE(o) ((o) == W0 && stale0)

/* freeChain(head, cnt, want, alt, me, prog): frees from head, cnt blocks,
 * taking each from stamp want or alt for me; with prog, the record's
 * chain word names the rest before each block is freed. */
inline freeChain(fh, fc, want, alt, me, prog, ghostok) {
	do
	:: fc > 0 && fh != NONE ->
		atomic {
			if
			:: st[fh] == me && who[fh] != me -> assert(ghostok); who[fh] = me  /* its own chain: the record's BUSY took it */
			:: st[fh] == me && who[fh] == me -> skip
#ifdef NOCAS
			:: st[fh] != me -> assert(ghostok); who[fh] = me; st[fh] = me
#else
			:: st[fh] != me && (st[fh] == want || st[fh] == alt) -> assert(ghostok); who[fh] = me; st[fh] = me
			:: st[fh] != me && st[fh] != want && st[fh] != alt -> skip
#endif
			fi;
			sst = st[fh]; nx = hd_nx[fh]
		}
		if
		:: sst != me -> break
		:: else -> skip
		fi;
#ifndef NOPROGRESS
		if
		:: prog -> atomic { rhead = nx; rcnt = fc - 1 }
		:: else -> skip
		fi;
#endif
		atomic { bm[fh] = 0 }
		atomic { assert(who[fh] == me); who[fh] = FREE; st[fh] = 0; hd_nx[fh] = NONE }
		fh = nx; fc--
	:: else -> break
	od;
	if
	:: prog -> atomic { rhead = NONE; rcnt = 0 }
	:: else -> skip
	fi
}

#define WORKER_LOCALS byte ops, g, i, b, first, prev, fh, fc, sst, nx, want; bool got

inline work(me) {
	do
	:: ops < OPS -> ops++;
		if
		/* fill */
		:: atomic { (rph == EMPTY || rph == TOMB) -> rph = RES; rgen++; g = rgen; rown = me; rB = me; rhead = NONE; rcnt = 0 }
			first = NONE; prev = NONE; i = 0; got = true;
			do
			:: i < L ->
				atomic {
					if
					:: bm[0] == 0 -> b = 0
					:: bm[1] == 0 -> b = 1
					:: bm[2] == 0 -> b = 2
#if NB > 3
					:: bm[3] == 0 -> b = 3
#endif
					:: else -> b = NONE
					fi
				}
				if
				:: b != NONE ->
					atomic {
						if
						:: st[b] == 0 || STALE(st[b]) -> assert(who[b] == FREE || (who[b] == W0 && stale0)); who[b] = me; st[b] = me; hd_nx[b] = NONE
						:: else -> b = NONE
						fi
					}
				:: else -> skip
				fi;
				if
				:: b == NONE -> got = false; break
				:: else -> skip
				fi;
				atomic { bm[b] = 1 }
				if
				:: prev == NONE -> first = b
				:: else -> atomic { hd_nx[prev] = b }
				fi;
				prev = b; i++
			:: else -> break
			od;
			if
			:: !got ->  /* the pool is short: the part built is freed, the reservation released */
				fh = first; fc = i; freeChain(fh, fc, me, me, me, false, true);
				atomic { rph == RES && rgen == g && rown == me -> rph = TOMB; rown = 0 }
			:: else ->
				atomic { rhead = first; rcnt = L }
				atomic {
					if
					:: rph == RES && rgen == g && rown == me ->
						rph = COMP; rown = 0;
						fh = first;
						do
						:: fh != NONE -> who[fh] = REC; wgen[fh] = g; fh = hd_nx[fh]
						:: else -> break
						od;
						got = true
					:: else -> got = false
					fi
				}
				if
				:: !got -> fh = first; fc = L; freeChain(fh, fc, me, me, me, false, true)
				:: else -> skip
				fi
			fi
		/* drop */
		:: atomic { rph == COMP -> rph = BUSY; rgen++; g = rgen; rown = me }
			atomic { fh = rhead; fc = rcnt; want = rB }
			freeChain(fh, fc, want, me, me, true, (who[fh] == REC && wgen[fh] == g - 1));
			atomic { rph == BUSY && rgen == g && rown == me -> rph = TOMB; rown = 0 }
		/* lazy release of a reaped owner's record with no chain */
		:: atomic { (rph == RES || rph == BUSY) && STALE(rown) && rcnt == 0 -> rph = TOMB; rgen++; rown = 0 }
		:: else -> skip
		fi
	:: else -> break
	od
}

proctype worker1() {
	WORKER_LOCALS;
	work(W1);
	done++
}

proctype worker0() {
	WORKER_LOCALS;
	{ work(W0) } unless { crash };
	dead0 = true
}

proctype crasher() {
	if
	:: !dead0 -> crash = true
	:: true -> skip
	fi
}

byte cst[NB], cnx[NB];
bool cand[NB], hold[NB];

proctype reaper() {
	byte i, b, s_ph, s_gen, s_own, g, fh, fc, sst, nx, want, dg, cc, walked;
	bool ok;
	dead0;
	stale0 = true;
	/* releaseStale: the dead owner's record */
	atomic { s_ph = rph; s_gen = rgen; s_own = rown; cc = rcnt }
	if
	:: (s_ph == RES || s_ph == BUSY) && s_own == W0 && cc > 0 ->
		atomic {
			if
			:: rph == s_ph && rgen == s_gen && rown == s_own -> rph = BUSY; rgen++; g = rgen; rown = SUP; ok = true
			:: else -> ok = false
			fi
		}
		if
		:: ok && s_ph == BUSY ->
			atomic { fh = rhead; fc = rcnt; want = rB }
			dg = s_gen - 1;  /* the chain was completed at the generation before the drop's BUSY */
			freeChain(fh, fc, want, W0, SUP, true, ((who[fh] == REC && wgen[fh] == dg) || who[fh] == W0))
		:: ok && s_ph == RES -> atomic { rhead = NONE; rcnt = 0 }
		:: else -> skip
		fi;
		if
		:: ok -> atomic { rph == BUSY && rgen == g && rown == SUP -> rph = TOMB; rown = 0 }
		:: else -> skip
		fi
	:: (s_ph == RES || s_ph == BUSY) && s_own == W0 && cc == 0 ->
		atomic {
			if
			:: rph == s_ph && rgen == s_gen && rown == s_own -> rph = TOMB; rgen++; rown = 0
			:: else -> skip
			fi
		}
	:: else -> skip
	fi;
	/* reclaimStale: candidates */
	i = 0;
	do
	:: i < NB ->
		atomic { cand[i] = bm[i] }
		if
		:: cand[i] -> atomic { cst[i] = st[i]; cnx[i] = hd_nx[i]; cand[i] = (st[i] == W0) }
		:: else -> skip
		fi;
		i++
	:: else -> break
	od;
	/* held */
	atomic { s_ph = rph; s_gen = rgen; fh = rhead; cc = rcnt }
	if
	:: s_ph == BUSY && cc > 0 && fh != NONE -> hold[fh] = true
	:: s_ph == COMP ->
		walked = 0; b = fh; i = 0;
		do
		:: i < cc && b != NONE -> walked = walked | (1 << b); atomic { b = hd_nx[b] }; i++
		:: else -> break
		od;
		atomic {
			if
			:: rph == s_ph && rgen == s_gen ->
				i = 0;
				do
				:: i < NB -> hold[i] = hold[i] || ((walked >> i) & 1); i++
				:: else -> break
				od
			:: else -> skip
			fi
		}
	:: else -> skip
	fi;
	/* take and free */
	i = 0;
	do
	:: i < NB ->
#ifdef NOHELD
		if
		:: cand[i] ->
#else
		if
		:: cand[i] && !hold[i] ->
#endif
			atomic {
				if
				:: st[i] == cst[i] && hd_nx[i] == cnx[i] ->
					assert(who[i] == W0 || (who[i] == REC && !(rph == COMP && rgen == wgen[i])));  /* REAPOK */
					st[i] = REAP; who[i] = REAP; ok = true
				:: else -> ok = false
				fi
			}
			if
			:: ok ->
				atomic { bm[i] = 0 }
				atomic { who[i] = FREE; st[i] = 0; hd_nx[i] = NONE }
			:: else -> skip
			fi
		:: else -> skip
		fi;
		i++
	:: else -> break
	od;
	/* EXACT: once worker 1 is done, the blocks in use are the COMPLETE record's chain */
	done == 1;
	atomic {
		assert(rph != BUSY && rph != RES);
		i = 0;
		do
		:: i < NB ->
			if
			:: bm[i] -> assert(who[i] == REC && rph == COMP && wgen[i] == rgen && st[i] == rB)  /* EXACT */
			:: else -> assert((st[i] == 0 && who[i] == FREE) || (st[i] == W0 && who[i] == W0))  /* EXACT: free, or left by the dead taking or giving it back */
			fi;
			i++
		:: else -> break
		od
	}
}

init {
	atomic {
		run worker1();
		run worker0();
		run crasher();
		run reaper()
	}
}
