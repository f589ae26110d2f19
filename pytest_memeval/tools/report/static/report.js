// The memeval report's search and filter, inlined into the page by tools/report/; the
// page's Content-Security-Policy admits exactly this text, by its SHA-256 hash.
(function(){
  var q=document.getElementById('q'), f=document.getElementById('only'),
      rows=[].slice.call(document.querySelectorAll('#scenarios tbody tr.scn')),
      shown=document.getElementById('shown');
  function apply(){
    var text=q.value.toLowerCase(), only=f.value, n=0;
    rows.forEach(function(r){
      var hit=(!text || r.textContent.toLowerCase().indexOf(text)>=0) &&
              (!only || r.classList.contains(only));
      r.hidden=!hit; if(hit){n++;}
    });
    shown.textContent=n+' of '+rows.length+' scenarios shown';
  }
  // A link may carry a search: report.html#q=s0003 (and #only=fixed).
  var h=new URLSearchParams(location.hash.slice(1));
  if(h.get('q')){q.value=h.get('q');}
  if(h.get('only')){f.value=h.get('only');}
  q.addEventListener('input',apply); f.addEventListener('change',apply); apply();
})();
