/*
 * cache.pml: the response cache's record protocol in package shm
 * (shm/cache.go: CacheLookup, CacheLock, CacheFill and their helpers;
 * shm/blocks.go: evictBlocks and drop; the claim of shm/responses.go),
 * for one cache key K on a table of N records probed from record 0 (K's
 * home), beside entries of another key K2 that claims may evict.
 *
 * Two workers each run OPS operations, a fill or a read:
 *   fill: scan for K's fill lock (a RESERVED record of K) and a record to
 *         claim; without a lock, take the insert lock of K's home, scan
 *         again, claim (BUSY, key, RESERVED), give the insert lock back,
 *         write the response's bytes, publish (RESERVED -> COMPLETE) and
 *         drop every other COMPLETE record of K;
 *   read: scan for a COMPLETE record of K, copy its bytes, check its
 *         state again.
 * An evictor drops COMPLETE records at any moment (evictBlocks), and with
 * CRASH worker 0 may die right after its BUSY claim or once it holds the
 * fill lock (RESERVED); it is then reaped at once
 * (dead[0]), and whoever meets what it held releases it.
 *
 * Every atomic{} is one access to one shared word (a load, a store or a
 * CAS) plus local computation. A record's state word is ph/gen/own,
 * always read and CASed together; key and data are words of their own.
 *
 * Properties (assertions):
 *   P1 "locks<=1"  never two fill locks of K (a key is filled once at a time);
 *   P2 "d==pub[i]" a read whose state check passes copied exactly the bytes
 *                  that record published (no torn read is ever served);
 *   P3 "d>=floor"  a read that begins after a fill returned never serves
 *                  an older response than that fill's.
 *
 * Broken variants, each must produce a counterexample:
 *   -DNOLOCK     claims without the insert lock and its rescan (P1)
 *   -DNORECHECK  reads without checking the state again (P2)
 *   -DNODROP     a fill that leaves the older entries (P3)
 */

#ifndef N
#define N 3
#endif
#ifndef OPS
#define OPS 2
#endif

#define EMPTY 0
#define BUSY  1
#define RES   2
#define COMP  3
#define TOMB  4

#define K  1
#define K2 2
#define NONE 255

byte ph[N];
byte gen[N];
byte own[N];     /* owner + 1 while BUSY or RESERVED; 0 otherwise */
byte key[N];
byte data[N];    /* the version of the response whose bytes the record holds */
byte il;         /* insert lock of K's home record: owner + 1, 0 = free */
bool dead[2];    /* a reaped worker: what it owned is stale */

/* ghosts */
byte pub[N];     /* the version record i published at its last COMPLETE */
byte ver;        /* versions handed out to fills */
byte latest;     /* the newest version whose fill has returned */

#define LOCKS ((ph[0] == RES && key[0] == K) + (ph[1] == RES && key[1] == K) + \
               (N > 2 && ph[N-1] == RES && key[N-1] == K))

active proctype monitor() {
	assert(LOCKS <= 1) /* "locks<=1": evaluated at every reachable point */
}

/* release the BUSY or RESERVED record i of a dead owner, if it is still
 * in the state read (sp, sg, so): one CAS */
inline releaseDead(i, sp, sg, so) {
	atomic {
		if
		:: ph[i] == sp && gen[i] == sg && own[i] == so -> ph[i] = TOMB; own[i] = 0
		:: else -> skip
		fi
	}
}

proctype worker(byte me) {
	byte op, i, j, cand, evict, sp, sg, so, k, v, d, floor, mine;
	bool locked;
	byte crashed = 0;
	op = 0;
	do
	:: op < OPS ->
		op++;
		if
		:: true -> goto fill
		:: true -> goto read
		fi;

fill:
		locked = false;
rescan:
		cand = NONE; evict = NONE; i = 0;
		do
		:: i < N ->
			atomic { sp = ph[i]; sg = gen[i]; so = own[i] }
			if
			:: sp == EMPTY ->
				if :: cand == NONE -> cand = i :: else -> skip fi;
				break
			:: sp == TOMB ->
				if :: cand == NONE -> cand = i :: else -> skip fi
			:: (sp == BUSY || sp == RES) && so > 0 && dead[so - 1] ->
				releaseDead(i, sp, sg, so);
				if :: cand == NONE -> cand = i :: else -> skip fi
			:: (sp == BUSY || sp == RES) && !(so > 0 && dead[so - 1]) ->
				k = key[i];
				if
				:: sp == RES && k == K -> goto unlockDone /* K is being filled: wait (not modelled), done */
				:: else -> skip
				fi
			:: sp == COMP ->
				k = key[i];
				if
				:: k != K && evict == NONE -> evict = i
				:: else -> skip
				fi
			fi;
			i++
		:: else -> break
		od;
		if
		:: cand == NONE -> cand = evict
		:: else -> skip
		fi;
		if
		:: cand == NONE -> goto unlockDone /* full: fetch, store nothing */
		:: else -> skip
		fi;
#ifndef NOLOCK
		if
		:: !locked ->
			/* lockWord: take it, or release it from a dead holder */
			do
			:: atomic { il == 0 -> il = me + 1 }; break
			:: atomic { il > 0 && dead[il - 1] -> il = 0 }
			od;
			locked = true;
			goto rescan
		:: else -> skip
		fi;
#endif
		/* claim: the state, the key of an entry, then one CAS to BUSY */
		atomic { sp = ph[cand]; sg = gen[cand] }
		if
		:: sp == COMP -> k = key[cand];
			if :: k == K -> goto unlockDone :: else -> skip fi /* never K's own entry */
		:: sp == EMPTY || sp == TOMB -> skip
		:: else -> goto unlockDone /* taken meanwhile: the Go code looks again */
		fi;
		atomic {
			if
			:: ph[cand] == sp && gen[cand] == sg -> ph[cand] = BUSY; gen[cand] = (sg + 1) % 4; own[cand] = me + 1; mine = cand
			:: else -> mine = NONE
			fi
		}
		if :: mine == NONE -> goto unlockDone :: else -> skip fi;
#ifdef CRASH
		if :: me == 0 && crashed == 0 -> crashed = 1; goto die :: true -> skip fi;
#endif
		key[mine] = K;
		atomic {
			if
			:: ph[mine] == BUSY && own[mine] == me + 1 -> ph[mine] = RES
			:: else -> mine = NONE /* reaped as dead meanwhile */
			fi
		}
		if
		:: locked -> atomic { if :: il == me + 1 -> il = 0 :: else -> skip fi }; locked = false
		:: else -> skip
		fi;
		if :: mine == NONE -> goto next :: else -> skip fi;
#ifdef CRASH
		if :: me == 0 && crashed == 0 -> crashed = 1; goto die :: true -> skip fi;
#endif
		/* the fetch, then the bytes */
		atomic { ver++; v = ver };
		data[mine] = v;
		/* publish */
		atomic {
			if
			:: ph[mine] == RES && own[mine] == me + 1 -> ph[mine] = COMP; own[mine] = 0; pub[mine] = v
			:: else -> mine = NONE
			fi
		}
		if :: mine == NONE -> goto next :: else -> skip fi;
#ifndef NODROP
		/* drop the other entries of K */
		j = 0;
		do
		:: j < N ->
			if
			:: j != mine ->
				atomic { sp = ph[j]; sg = gen[j] }
				if
				:: sp == COMP ->
					k = key[j];
					if
					:: k == K -> atomic { if :: ph[j] == COMP && gen[j] == sg -> ph[j] = TOMB :: else -> skip fi }
					:: else -> skip
					fi
				:: else -> skip
				fi
			:: else -> skip
			fi;
			j++
		:: else -> break
		od;
#endif
		atomic { if :: v > latest -> latest = v :: else -> skip fi };
		goto next;
unlockDone:
		if
		:: locked -> atomic { if :: il == me + 1 -> il = 0 :: else -> skip fi }; locked = false
		:: else -> skip
		fi;
		goto next;

read:
		floor = latest;
		i = 0;
		do
		:: i < N ->
			atomic { sp = ph[i]; sg = gen[i] }
			if
			:: sp == EMPTY -> break
			:: sp == COMP ->
				k = key[i];
				if
				:: k == K ->
					d = data[i];
#ifndef NORECHECK
					atomic {
						if
						:: ph[i] == sp && gen[i] == sg -> assert(d == pub[i]); assert(d >= floor)
						:: else -> skip /* changed while read: a miss */
						fi
					}
#else
					assert(d == pub[i]);
#endif
					break
				:: else -> skip
				fi
			:: else -> skip
			fi;
			i++
		:: else -> break
		od;
		goto next;
next:
		/* locals dead from here on: zeroed, so that states merge */
		atomic { i = 0; j = 0; cand = 0; evict = 0; sp = 0; sg = 0; so = 0; k = 0; v = 0; d = 0; floor = 0; mine = 0 }
	:: else -> break
	od;
	goto end;
die:
	dead[me] = true; /* the supervisor reaps it */
end:
	skip
}

/* evictBlocks: drops COMPLETE records, of either key, at any moment */
active proctype evictor() {
	byte n, i, sg;
	do
	:: n < 2 ->
		n++;
		if
		:: i = 0
		:: i = 1
		:: N > 2 -> i = N - 1
		fi;
		atomic { if :: ph[i] == COMP -> sg = gen[i] :: else -> sg = 255 fi }
		if
		:: sg != 255 -> atomic { if :: ph[i] == COMP && gen[i] == sg -> ph[i] = TOMB :: else -> skip fi }
		:: else -> skip
		fi
	:: true -> break
	od
}

init {
	/* an entry of another key, for claims to evict */
	ph[1] = COMP; key[1] = K2;
	atomic {
		run worker(0);
		run worker(1)
	}
}
